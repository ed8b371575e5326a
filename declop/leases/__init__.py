"""Who may act: leader election and sharding, both built on coordination.k8s.io Leases.

Owns the leader elector (acquire, renew, the fence that closes at the renew deadline), the shard
ranges and the hash that puts an object in one (the same FNV-1a as the apiserver's sharded list
and watch), the shard Lease protocol that spreads ranges over replicas, and the watchdog that
ends the process within 2 s of a lost Lease. Speaks to the
apiserver only through the small client interface it is given. May import the base modules.
"""
