"""``shadowpod crds``: write the CRDs of the operator's kinds, generated from their models."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import yaml

from shadowpod.kube.models.crd import manifests
from shadowpod.kube.models.structural import crd_problems
from shadowpod.kube.models.v1alpha1 import RESOURCES


@click.command("crds")
@click.option(
    "--output-dir",
    "-o",
    default=Path("crds"),
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write <group>_<plural>.yaml into.",
)
@click.option(
    "--check",
    is_flag=True,
    help="Write nothing; exit 1 if a file in the directory differs from what would be written.",
)
def crds(output_dir: Path, check: bool) -> None:
    """Generate crds/ from the AgentSession and AgentMigration models."""
    generated = manifests(RESOURCES)
    for name, text in generated.items():
        if problems := crd_problems(yaml.safe_load(text)):
            # Only a change to the models can cause this: say what the API server would refuse.
            click.echo(f"error: {name} would be refused by the API server:", err=True)
            for problem in problems:
                click.echo(f"  {problem}", err=True)
            sys.exit(2)
    if check:
        stale = [
            name
            for name, text in generated.items()
            if not (output_dir / name).is_file() or (output_dir / name).read_text() != text
        ]
        if stale:
            click.echo(
                f"error: {', '.join(stale)} in {output_dir} differ(s) from the models:"
                " run `shadowpod crds` and commit the result",
                err=True,
            )
            sys.exit(1)
        return
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        for name, text in generated.items():
            (output_dir / name).write_text(text)
    except OSError as exc:
        click.echo(f"error: cannot write to {output_dir}: {exc.strerror}", err=True)
        sys.exit(1)
    for name in generated:
        click.echo(str(output_dir / name))
