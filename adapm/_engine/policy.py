"""Management variants: what each needs of the engine, and which native rules its owners decide by.

For every key it owns, a node keeps two bit masks over node ranks (in its native directory,
per active key: native/records.h):

- S, the nodes that currently have (acted-on) intent for the key, the owner included;
- R, the nodes that hold a replica of it.

When a node's intent for owned keys starts or ends, the owner decides per key (management
``adaptive``; native/policy.c runs the rules, one pass per batch):

- S = {r}, r ≠ owner         → relocate the key to r (value, version, S and R move);
- |S| ≥ 2                    → a replica at every r ∈ S \\ ({owner} ∪ R);
- r ∈ R but r ∉ S            → r's replica is dropped (r dropped it before telling us);
- otherwise                  → nothing moves.

``relocation_only`` relocates to every node that newly signals intent (the most recent wins, as
in Lapse); ``replication_only`` never relocates and replicates to every non-owner with intent;
``static_partition`` (no rounds at all) and ``full_replication`` (every node replicates every
key; rounds only sync them) ignore intent. A mask is ``ceil(world_size / 64)`` uint64 words per
key, so the intent-based variants run on any number of nodes. The rules' numpy-array reference
is in tests/engine_reference.py.
"""

from __future__ import annotations


class Policy:
    """A management variant, as the engine sees it: whether rounds run, whether nodes report
    their intents, whether every node holds every key, and which native rules decide
    (``variant``, native/policy.h; -1: none, the variant keeps no masks). Immutable."""

    variant = -1
    runs_rounds = True  # the engine runs sync rounds (intents, replica deltas, checks)
    reports_intents = True  # nodes tell owners when their intent for a key starts or ends
    replicates_everything = False  # every node holds a replica of every key it does not own


class StaticPartition(Policy):
    """Keys stay at their home; non-home access is remote. No rounds, no reports."""

    name = "static_partition"
    runs_rounds = False
    reports_intents = False


class FullReplication(Policy):
    """Every node holds every key (replicas of the keys homed elsewhere), synced every round."""

    name = "full_replication"
    reports_intents = False
    replicates_everything = True


class Adaptive(Policy):
    """S = {r}, r != owner: relocate to r; |S| >= 2: a replica at every other node in S."""

    name = "adaptive"
    variant = 0  # POLICY_ADAPTIVE


class ReplicationOnly(Policy):
    """Never relocates: a replica at every non-owner with intent."""

    name = "replication_only"
    variant = 1  # POLICY_REPLICATION_ONLY


class RelocationOnly(Policy):
    """Relocates to every node that newly signals intent (the latest wins, as in Lapse)."""

    name = "relocation_only"
    variant = 2  # POLICY_RELOCATION_ONLY


POLICIES = {policy.name: policy() for policy in (
    Adaptive, RelocationOnly, ReplicationOnly, StaticPartition, FullReplication)}


def make_policy(management: str) -> Policy:
    """The policy of ``Config.management`` (one shared immutable object per variant)."""
    return POLICIES[management]
