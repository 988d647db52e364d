"""People and roles: the admin-signed team policy every agent keeps (:mod:`agent.people.keeper`)
and the rules that decide, at the agent that executes a command, whether its signer may give it
(:mod:`agent.people.rules`)."""
