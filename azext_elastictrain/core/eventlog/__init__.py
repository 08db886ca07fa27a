"""Readings of a job's event log (``<job>/events.jsonl``): its events, how a job recovered, where its time
went, its timeline, and `job show`'s view. The same reading on every backend."""
