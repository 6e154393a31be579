"""Sessions that follow an AgentDeployment (``spec.deploymentRef``): the session as the
operator runs it — the template's fields under the session's own — and the image it
runs.

A field the session leaves empty (a list, an unset value) or at its default (the
migration and checkpoint policies, resources) comes from the template; a field it sets
wins. A following session without ``spec.image`` is *rolled out*: its image is the one
its owner runs, and only the AgentDeployment's rollouts change it (one AgentMigration
each, paced); a new one starts on the version the rollout says
(``fleet.planner.version_for_new_session``). With its own ``spec.image`` it is moved by
its own image changes, as any session, and the rollouts pass it by.
"""

from __future__ import annotations

from typing import Any

from shadowpod.fleet.planner import version_for_new_session
from shadowpod.kube.api import namespaced
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.core import ResourceRequirements
from shadowpod.kube.models.v1alpha1 import AgentDeployment, AgentSession, MigrationPolicy
from shadowpod.kube.models.v1alpha1.session import CheckpointPolicy


def rolled_out(body: dict[str, Any]) -> bool:
    """Whether the session's image is its AgentDeployment's to choose."""
    spec = body.get("spec") or {}
    return bool(spec.get("deploymentRef")) and not spec.get("image")


def new_session_image(deployment: AgentDeployment) -> str:
    """The image a session of ``deployment`` starts on now: the stable one until the
    rollout's canary steps are through, else the template's."""
    status = deployment.status
    if status is None:
        return deployment.spec.template.image
    try:
        strategy = deployment.spec.strategy.to_strategy()
    except ValueError:  # said on the AgentDeployment; the template's version meanwhile
        return deployment.spec.template.image
    chosen = version_for_new_session(status.rollout_state(), strategy)
    return chosen or deployment.spec.template.image


def merged(session: AgentSession, deployment: AgentDeployment, image: str | None) -> AgentSession:
    """``session`` with the template's fields where it leaves them empty or default."""
    spec = session.spec
    template = deployment.spec.template
    update: dict[str, Any] = {"image": spec.image or image}
    for field in ("command", "args", "env", "credentials"):
        if not getattr(spec, field):
            update[field] = getattr(template, field)
    for field in ("image_pull_policy", "memory", "identity"):
        if getattr(spec, field) is None:
            update[field] = getattr(template, field)
    if spec.resources == ResourceRequirements():
        update["resources"] = template.resources
    if spec.checkpoint == CheckpointPolicy():
        update["checkpoint"] = template.checkpoint
    if spec.migration == MigrationPolicy():
        update["migration"] = deployment.spec.migration
    return session.model_copy(update={"spec": spec.model_copy(update=update)})


async def deployment_of(ctx: OperatorContext, session: AgentSession) -> AgentDeployment | None:
    ref = session.spec.deployment_ref
    if ref is None:
        return None
    found = await ctx.api.get(
        namespaced("agentdeployments", session.metadata.namespace or "default", ref.name)
    )
    return None if found is None else AgentDeployment.model_validate(found)


async def effective(ctx: OperatorContext, body: dict[str, Any]) -> AgentSession:
    """The session as the operator runs it. A rolled-out session's image: what its owner
    runs (``status.image``), else the rollout's choice for a new session; with its
    AgentDeployment missing, none (``spec.image`` stays unset: the reconciler says so)."""
    session = AgentSession.model_validate(dict(body))
    deployment = await deployment_of(ctx, session)
    if deployment is None:
        if rolled_out(body) and session.status is not None and session.status.image:
            spec = session.spec.model_copy(update={"image": session.status.image})
            return session.model_copy(update={"spec": spec})
        return session
    image = None
    if rolled_out(body):
        running = session.status.image if session.status is not None else None
        image = running or new_session_image(deployment)
    return merged(session, deployment, image)
