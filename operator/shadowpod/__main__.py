"""``python -m shadowpod`` is the ``shadowpod`` command."""

from shadowpod.cli.main import main

main()
