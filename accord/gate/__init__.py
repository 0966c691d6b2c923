"""The rollout gate: a deploy config checked end to end (preflight, profile_run, the
recorded greedy generation against the reference, server-path checks, op conformance
at the recorded signatures) and its reports. Sits above `conformance` and `server`."""
