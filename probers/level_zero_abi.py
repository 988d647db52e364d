"""The Level Zero Sysman ABI as ``probers.level_zero`` calls it through ctypes: the constants, the
structures and the prototypes of every entry point used.

They follow the Level Zero headers (``include/zes_api.h`` and ``ze_api.h`` of
oneapi-src/level-zero, spec 1.x) field for field; the tests check their sizes against the C layout
worked out by hand.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

# --- constants from ze_api.h / zes_api.h -------------------------------------------------------

ZE_RESULT_SUCCESS = 0
ZE_RESULT_ERROR_DEVICE_LOST = 0x70000001
ZE_RESULT_ERROR_UNINITIALIZED = 0x78000001
ZE_MAX_DEVICE_NAME = 256
ZE_MAX_DEVICE_UUID_SIZE = 16
ZES_STRING_PROPERTY_SIZE = 64
ZE_DEVICE_TYPE_GPU = 1
ZE_DEVICE_PROPERTY_FLAG_INTEGRATED = 1 << 0
ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE = 1 << 1

ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES = 0x3
ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES = 0x1
ZES_STRUCTURE_TYPE_PCI_PROPERTIES = 0x2
ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES = 0x5
ZES_STRUCTURE_TYPE_MEM_PROPERTIES = 0xB
ZES_STRUCTURE_TYPE_POWER_PROPERTIES = 0xD
ZES_STRUCTURE_TYPE_TEMP_PROPERTIES = 0x14
ZES_STRUCTURE_TYPE_MEM_STATE = 0x1E

ZES_MEM_LOC_SYSTEM = 0
ZES_MEM_LOC_DEVICE = 1

ZES_TEMP_SENSORS_GLOBAL = 0
ZES_TEMP_SENSORS_GPU = 1

ZES_ENGINE_GROUP_ALL = 0
ZES_ENGINE_GROUP_COMPUTE_ALL = 1
ZES_ENGINE_GROUP_3D_RENDER_COMPUTE_ALL = 11
ZES_ENGINE_GROUP_RENDER_ALL = 12

ze_bool_t = ctypes.c_uint8
_enum = ctypes.c_int32  # C enums with a *_FORCE_UINT32 = 0x7fffffff member: 4 bytes


class ZeDeviceProperties(ctypes.Structure):
    """``ze_device_properties_t``."""

    _fields_ = (
        ("stype", _enum),
        ("pNext", ctypes.c_void_p),
        ("type", _enum),
        ("vendorId", ctypes.c_uint32),
        ("deviceId", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("subdeviceId", ctypes.c_uint32),
        ("coreClockRate", ctypes.c_uint32),
        ("maxMemAllocSize", ctypes.c_uint64),
        ("maxHardwareContexts", ctypes.c_uint32),
        ("maxCommandQueuePriority", ctypes.c_uint32),
        ("numThreadsPerEU", ctypes.c_uint32),
        ("physicalEUSimdWidth", ctypes.c_uint32),
        ("numEUsPerSubslice", ctypes.c_uint32),
        ("numSubslicesPerSlice", ctypes.c_uint32),
        ("numSlices", ctypes.c_uint32),
        ("timerResolution", ctypes.c_uint64),
        ("timestampValidBits", ctypes.c_uint32),
        ("kernelTimestampValidBits", ctypes.c_uint32),
        ("uuid", ctypes.c_uint8 * ZE_MAX_DEVICE_UUID_SIZE),
        ("name", ctypes.c_char * ZE_MAX_DEVICE_NAME),
    )


class ZesDeviceProperties(ctypes.Structure):
    """``zes_device_properties_t``."""

    _fields_ = (
        ("stype", _enum),
        ("pNext", ctypes.c_void_p),
        ("core", ZeDeviceProperties),
        ("numSubdevices", ctypes.c_uint32),
        ("serialNumber", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
        ("boardNumber", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
        ("brandName", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
        ("modelName", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
        ("vendorName", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
        ("driverVersion", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
    )


class ZesPciAddress(ctypes.Structure):
    """``zes_pci_address_t``."""

    _fields_ = (
        ("domain", ctypes.c_uint32),
        ("bus", ctypes.c_uint32),
        ("device", ctypes.c_uint32),
        ("function", ctypes.c_uint32),
    )


class ZesPciSpeed(ctypes.Structure):
    """``zes_pci_speed_t``."""

    _fields_ = (
        ("gen", ctypes.c_int32),
        ("width", ctypes.c_int32),
        ("maxBandwidth", ctypes.c_int64),
    )


class ZesPciProperties(ctypes.Structure):
    """``zes_pci_properties_t``."""

    _fields_ = (
        ("stype", _enum),
        ("pNext", ctypes.c_void_p),
        ("address", ZesPciAddress),
        ("maxSpeed", ZesPciSpeed),
        ("haveBandwidthCounters", ze_bool_t),
        ("havePacketCounters", ze_bool_t),
        ("haveReplayCounters", ze_bool_t),
    )


class ZesMemProperties(ctypes.Structure):
    """``zes_mem_properties_t``."""

    _fields_ = (
        ("stype", _enum),
        ("pNext", ctypes.c_void_p),
        ("type", _enum),
        ("onSubdevice", ze_bool_t),
        ("subdeviceId", ctypes.c_uint32),
        ("location", _enum),
        ("physicalSize", ctypes.c_uint64),
        ("busWidth", ctypes.c_int32),
        ("numChannels", ctypes.c_int32),
    )


class ZesMemState(ctypes.Structure):
    """``zes_mem_state_t``: ``free`` and ``size`` in bytes."""

    _fields_ = (
        ("stype", _enum),
        ("pNext", ctypes.c_void_p),
        ("health", _enum),
        ("free", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
    )


class ZesPowerProperties(ctypes.Structure):
    """``zes_power_properties_t``: limits in milliwatts, -1 when unknown."""

    _fields_ = (
        ("stype", _enum),
        ("pNext", ctypes.c_void_p),
        ("onSubdevice", ze_bool_t),
        ("subdeviceId", ctypes.c_uint32),
        ("canControl", ze_bool_t),
        ("isEnergyThresholdSupported", ze_bool_t),
        ("defaultLimit", ctypes.c_int32),
        ("minLimit", ctypes.c_int32),
        ("maxLimit", ctypes.c_int32),
    )


class ZesPowerEnergyCounter(ctypes.Structure):
    """``zes_power_energy_counter_t``: microjoules and a microsecond timestamp."""

    _fields_ = (("energy", ctypes.c_uint64), ("timestamp", ctypes.c_uint64))


class ZesPowerSustainedLimit(ctypes.Structure):
    """``zes_power_sustained_limit_t``: ``power`` in milliwatts, ``interval`` in milliseconds."""

    _fields_ = (
        ("enabled", ze_bool_t),
        ("power", ctypes.c_int32),
        ("interval", ctypes.c_int32),
    )


class ZesTempProperties(ctypes.Structure):
    """``zes_temp_properties_t``."""

    _fields_ = (
        ("stype", _enum),
        ("pNext", ctypes.c_void_p),
        ("type", _enum),
        ("onSubdevice", ze_bool_t),
        ("subdeviceId", ctypes.c_uint32),
        ("maxTemperature", ctypes.c_double),
        ("isCriticalTempSupported", ze_bool_t),
        ("isThreshold1Supported", ze_bool_t),
        ("isThreshold2Supported", ze_bool_t),
    )


class ZesEngineProperties(ctypes.Structure):
    """``zes_engine_properties_t``."""

    _fields_ = (
        ("stype", _enum),
        ("pNext", ctypes.c_void_p),
        ("type", _enum),
        ("onSubdevice", ze_bool_t),
        ("subdeviceId", ctypes.c_uint32),
    )


class ZesEngineStats(ctypes.Structure):
    """``zes_engine_stats_t``: active microseconds and a microsecond timestamp."""

    _fields_ = (("activeTime", ctypes.c_uint64), ("timestamp", ctypes.c_uint64))


_H = ctypes.c_void_p
_PH = ctypes.POINTER(ctypes.c_void_p)
_PU32 = ctypes.POINTER(ctypes.c_uint32)

PROTOTYPES: dict[str, tuple[Any, ...]] = {
    "zesInit": (ctypes.c_uint32,),
    "zesDriverGet": (_PU32, _PH),
    "zesDeviceGet": (_H, _PU32, _PH),
    "zesDeviceGetProperties": (_H, ctypes.POINTER(ZesDeviceProperties)),
    "zesDevicePciGetProperties": (_H, ctypes.POINTER(ZesPciProperties)),
    "zesDeviceEnumMemoryModules": (_H, _PU32, _PH),
    "zesMemoryGetProperties": (_H, ctypes.POINTER(ZesMemProperties)),
    "zesMemoryGetState": (_H, ctypes.POINTER(ZesMemState)),
    "zesDeviceEnumPowerDomains": (_H, _PU32, _PH),
    "zesDeviceGetCardPowerDomain": (_H, _PH),
    "zesPowerGetProperties": (_H, ctypes.POINTER(ZesPowerProperties)),
    "zesPowerGetEnergyCounter": (_H, ctypes.POINTER(ZesPowerEnergyCounter)),
    "zesPowerGetLimits": (_H, ctypes.POINTER(ZesPowerSustainedLimit), _H, _H),
    "zesDeviceEnumTemperatureSensors": (_H, _PU32, _PH),
    "zesTemperatureGetProperties": (_H, ctypes.POINTER(ZesTempProperties)),
    "zesTemperatureGetState": (_H, ctypes.POINTER(ctypes.c_double)),
    "zesDeviceEnumEngineGroups": (_H, _PU32, _PH),
    "zesEngineGetProperties": (_H, ctypes.POINTER(ZesEngineProperties)),
    "zesEngineGetActivity": (_H, ctypes.POINTER(ZesEngineStats)),
}
"""Argument types of every entry point used; each returns ``ze_result_t`` (a 32-bit enum)."""
