"""cluster create --eviction-policy Deallocate through the real az: allowed (as az aks allows it), with a warning that
says what it costs an elastic job, before anything is sent (a dry run says it too)."""
from __future__ import annotations


def test_deallocate_is_warned_about_before_anything_is_sent(az, arm, group):
    result = az("elastictrain", "cluster", "create", "-g", group, "-n", "dealloc", "-l", "eastus", "--eviction-policy",
                "Deallocate", "--dry-run", "-o", "json", timeout=120)
    warning = result.stderr.split("--eviction-policy Deallocate:", 1)
    assert len(warning) == 2, result.stderr
    assert "stays in the cluster" in warning[1] and "Spot quota (lowPriorityCores)" in warning[1]
    assert "Leave the option out (Delete)" in warning[1]
    assert arm.writes() == [], "a dry run sends no write"
    quiet = az("elastictrain", "cluster", "create", "-g", group, "-n", "dealloc", "-l", "eastus", "--dry-run",
               "-o", "json", timeout=120)
    assert "Deallocate" not in quiet.stderr
