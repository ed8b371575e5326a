"""``python -m declop.testing.cluster.image_cli``: build the declop image (``make image`` runs it).

Prints the OCI archive's path as the last line of stdout; progress and errors go to stderr.
Bad input or a missing prerequisite (not root, no BuildKit, no checkout): one line, exit 2;
a failed build: the builder's last lines, exit 1. ``-v`` adds the traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from declop.errors import ConfigError
from declop.testing.cluster.image import ImageBuildError, declop_image
from declop.version import __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Build the declop image; print the tar's path last."""
    parser = argparse.ArgumentParser(
        prog="python -m declop.testing.cluster.image_cli",
        description="Build the declop image from the repository's Dockerfile with BuildKit "
        "(no Docker daemon, no registry): an OCI archive for `ctr images import`.",
    )
    parser.add_argument("--output", default="build/declop-image.tar", help="the OCI archive")
    parser.add_argument("--name", default=f"declop:{__version__}", help="the image's name")
    parser.add_argument("--source", default=None, help="a declop source tree (default: this declop, a checkout or the installed package)")
    parser.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    args = parser.parse_args(argv)
    try:
        started = time.monotonic()
        image = declop_image(output=args.output, name=args.name, source=args.source)
    except (ConfigError, ImageBuildError) as e:
        if args.verbose:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    print(
        f"built {image.name} ({image.digest}) in {time.monotonic() - started:.0f} s; "
        f"OCI layout {image.layout}; import with: ctr -n k8s.io images import {image.tar}",
        file=sys.stderr,
    )
    print(image.tar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
