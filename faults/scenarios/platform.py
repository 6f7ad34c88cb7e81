"""`pin up` itself killed: the whole stack (pin up, dagster dev, webserver, daemon, code
server, every run worker) SIGKILLed at once, as a host or container crash does, while
scraping jobs flow through sensor-launched worker runs; then started again on the same
PIN_HOME and database. The scraping invariants (faults.scenarios.scraping.check) must
hold: every job ends, one result object each, webhooks delivered.

Full mode only: each start of the stack costs ~20 s before the first run.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path
from subprocess import Popen

import pin_orchestration
from faults.core import FaultContext, Outcome, scenario, wait_until
from faults.scenarios.scraping import World, _feed, _world, check

REPOSITORY = Path(pin_orchestration.__file__).parent.parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_stack(world: World, number: int) -> Popen[bytes]:
    args = ["up", "--no-demo"]
    for option in ("--port", "--metrics-port", "--api-port"):
        args += [option, str(_free_port())]
    args += [
        "--dagster-yaml",
        str(REPOSITORY / "dagster.yaml"),
        "--workspace",
        str(REPOSITORY / "workspace.yaml"),
    ]
    return world.ctx.spawn_pin(args, world.env, name=f"pin-up-{number}")


@scenario(
    "platform-pin-up-sigkill",
    job="platform",
    fault="SIGKILL of pin up's whole tree",
    full_only=True,
)
def pin_up_killed(ctx: FaultContext) -> Outcome:
    from pin_orchestration.scraping.store.tenancy import create_tenant

    outcome = Outcome(job="platform", fault="SIGKILL of pin up's whole tree")
    if not (REPOSITORY / "dagster.yaml").exists():
        raise FileNotFoundError(f"{REPOSITORY / 'dagster.yaml'}: run from a checkout")
    jobs, kills = ctx.scale(60, 200), ctx.scale(1, 3)
    with _world(ctx) as world:
        stack = _start_stack(world, 0)
        tenant, _ = create_tenant(world.engine, "faults")
        world.feeding.set()
        threading.Thread(
            target=_feed, args=(world, tenant.id, jobs, 40.0 * kills), daemon=True
        ).start()
        wait_until(lambda: world.count("succeeded") > 0, timeout=240, what="a first job done")
        for number in range(1, kills + 1):
            time.sleep(ctx.rng.uniform(1.0, 5.0))
            killed_at = time.monotonic()
            ctx.sigkill_tree(stack)
            outcome.faults_injected += 1
            stack = _start_stack(world, number)
            outcome.recovered_after(
                world.progress_after(
                    killed_at, what="jobs done again after pin up restarted", timeout=300
                )
            )
        wait_until(world.done, timeout=300, what="every job ended and announced")
        stack.send_signal(signal.SIGTERM)  # the last stack stops cleanly
        stack.wait(timeout=60)
        ctx.stop_children()
        check(world, outcome)
    return outcome
