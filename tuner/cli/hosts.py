"""The commands that change a host for good: `tuner apply`, `tuner restore`; and `tuner trust-host`, which
pins a host's SSH key."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.cli.reading import holds_study, use_storage
from tuner.cli.signals import run_stoppable, stop_on_signals
from tuner.errors import ConfigError
from tuner.text import settings_text

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["apply", "restore", "trust_host"]


def apply(args: argparse.Namespace, console: Console) -> int:
    from tuner.apply import Applied, apply_to_hosts
    from tuner.config import load_study

    storage_url = use_storage(args)
    spec, base_dir = load_study(args.study, args.overrides)
    if args.hosts:
        from tuner.search import fleet_hosts

        fleet_hosts(spec, args.hosts)  # a wrong --host is the user's mistake (exit 2), run directory or not
    run_path = args.runs_dir / spec.name
    if not holds_study(run_path, storage_url):
        raise ConfigError(f"{run_path} holds no study; run `tuner run {args.study}` first")

    received: list[int] = []

    def applied(result: Applied) -> None:  # each host as it is done: a rollout may stop at the next
        settings = settings_text(result.server_settings, separator=", ", empty="(the baseline's)")
        stall, ttft = result.metrics.get("stall_tok_s"), result.metrics.get("ttft_p95_s")
        on = "" if result.host is None else f" on {result.host}"
        console.print(
            f"verification run{on}: {result.requests} requests, all answered"
            + (f"; stall {stall:.2f} tok/s" if stall is not None else "")
            + (f", TTFT p95 {ttft:.2f} s" if ttft is not None else "")
        )
        console.print(f"applied trial {result.trial} ({settings}){on} for good: {result.path}", highlight=False)
        for advice in result.client_advice:
            console.print(f"also set, which the host's configuration cannot carry: {advice}", highlight=False)

    async def main() -> list[Applied]:
        stop_on_signals(received)
        return await apply_to_hosts(
            spec,
            base_dir,
            run_path,
            trial=args.trial,
            hosts=args.hosts,
            say=console.print,
            applied=applied,
            storage_url=storage_url,
        )

    done = run_stoppable(main(), received)
    named = "".join(f" --host {a.host}" for a in done if a.host is not None) if args.hosts else ""
    console.print(f"`tuner restore {args.study}{named}` removes it", highlight=False)
    return 0


def restore(args: argparse.Namespace, console: Console) -> int:
    from tuner.apply import restore_hosts
    from tuner.config import load_study

    spec, base_dir = load_study(args.study, args.overrides)

    received: list[int] = []

    def restored(host: str | None, removed: str | None) -> None:
        on = "" if host is None else f"{host}: "
        if removed is None:
            console.print(f"{on}the host has no settings of `tuner apply`; nothing to remove", highlight=False)
        else:
            console.print(
                f"{on}removed {removed}; the unit runs the operator's own configuration again", highlight=False
            )

    async def main() -> None:
        stop_on_signals(received)
        await restore_hosts(spec, base_dir, hosts=args.hosts, restored=restored)

    run_stoppable(main(), received)
    return 0


def trust_host(args: argparse.Namespace, console: Console) -> int:
    from tuner.transports.ssh import DEFAULT_KNOWN_HOSTS, fetch_host_key, pin_host_key

    key = asyncio.run(fetch_host_key(args.host, args.port))
    known_hosts = (args.known_hosts or Path(DEFAULT_KNOWN_HOSTS)).expanduser()
    console.print(f"{args.host}:{args.port} offers a {key.get_algorithm()} key with fingerprint")
    console.print(f"  {key.get_fingerprint('sha256')}", highlight=False)
    console.print("compare it with `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` run on the host itself")
    if not args.yes:
        answer = console.input(f"pin it in {known_hosts}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            console.print("not pinned")
            return 1
    pin_host_key(known_hosts, args.host, args.port, key)
    console.print(f"pinned in {known_hosts}")
    return 0
