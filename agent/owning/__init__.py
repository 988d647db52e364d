"""The owner's half of the job protocol: accept, replicate, place, gangs, preempt, resize, hand
over."""
