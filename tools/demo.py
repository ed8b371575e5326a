"""`make demo`: play the seed scenario by itself and show the operator's lines.

Starts a local control plane, runs `declop run examples/pods.py` against it, then types what a
newcomer would type in a second terminal — kubectl run, label, delete — and prints each command
followed by the lines the operator logged in response. Stops everything at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from declop.testing import ControlPlane
from declop.testing.cluster.runner import OperatorProcess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    print("== starting a local control plane (etcd + kube-apiserver + kube-controller-manager)")
    with ControlPlane() as cp:
        print(f"   ready in {cp.startup_seconds:.1f} s at {cp.host}")
        env = cp.env()
        print("== declop run examples/pods.py")
        with OperatorProcess([os.path.join(ROOT, "examples", "pods.py")], env=env) as op:
            op.wait_for_line("Starting workers")
            shown = 0
            steps = [
                (["kubectl", "run", "nginx", "--image", "nginx"], "Pod created", 1),
                (["kubectl", "label", "pod", "nginx", "env=prod"], "Pod created", 2),
                (["kubectl", "delete", "pod", "nginx"], "The pod was deleted", 1),  # unscheduled: gone at once
            ]
            for cmd, needle, count in steps:
                print(f"\n$ {' '.join(cmd)}")
                out = subprocess.run(cmd, env=env, capture_output=True, text=True)
                print("  " + (out.stdout or out.stderr).strip())
                op.wait_for_line(needle, count=count)
                time.sleep(0.3)  # let any follow-up line of the same step arrive before printing
                for line in op.lines[shown:]:
                    if "Starting" not in line:
                        print(f"  operator: {line}")
                shown = len(op.lines)
        print(f"\n== operator exited with {op.returncode}; stopping the control plane")
    return 0


if __name__ == "__main__":
    sys.exit(main())
