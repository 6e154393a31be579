"""Fleet upgrades: a rollout strategy, the planner that drives one rollout, and the
cluster-wide pacing queue every migration passes. Pure decisions over observations
(no Kopf, no Kubernetes client, no I/O): the operator reads the world, calls them and
writes what they decide."""
