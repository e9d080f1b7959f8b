"""`tuner diagnose` (a server's log read, no host changed), `tuner setup` and `tuner kinds`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from tuner import catalog

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["diagnose", "kinds", "setup"]


def diagnose(args: argparse.Namespace, console: Console) -> int:
    from tuner.console import make_console
    from tuner.diagnose import diagnose_log
    from tuner.diagnose.study import read_like_study, write_study
    from tuner.diagnose_console import render_diagnosis

    # Before the log is read, which may take a while: a wrong --like is refused at once.
    like = read_like_study(args.like) if args.like is not None else None
    diagnosis = diagnose_log(
        args.log,
        long_prompt_tokens=args.long_prompt_tokens,
        min_wait_s=args.min_wait,
        since_s=args.since,
        until_s=args.until,
        metrics_scrape=args.metrics,
    )
    written = None
    if args.study is not None:
        written = write_study(diagnosis, args.log, args.study, like=like, force=args.force)
    prediction = None
    if args.predict:
        from tuner.predict import predict

        prediction = predict(
            diagnosis, args.log, space_path=args.space, seeds=args.seeds, long_prompt_tokens=args.long_prompt_tokens
        )
    if args.json:
        document = diagnosis.model_dump(mode="json")
        if prediction is not None:
            from tuner.predict import prediction_json

            document["prediction"] = prediction_json(prediction)
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
    else:
        render_diagnosis(diagnosis, console)
        if prediction is not None:
            from tuner.diagnose_console import render_prediction

            render_prediction(prediction, console)
    if written is not None:
        said = make_console(stderr=True) if args.json else console
        for path in written.paths:
            said.print(f"wrote {path}", markup=False, highlight=False)
        for note in written.notes:
            said.print(note, markup=False, highlight=False, soft_wrap=True)
    return 0


def setup(args: argparse.Namespace, console: Console) -> int:
    from tuner import assets

    console.print(f"model: {assets.ensure_model()}")
    console.print(f"llama-server: {assets.ensure_llama_server()}")
    console.print(f"test LoRA adapter: {assets.ensure_test_lora()}")
    if args.ollama:
        console.print(f"ollama: {assets.ensure_ollama()}")
        console.print(f"ollama model: {assets.ensure_ollama_model()} (OLLAMA_MODELS={assets.ollama_models_dir()})")
    return 0


def kinds(_args: argparse.Namespace, console: Console) -> int:
    console.print(f"host:   {', '.join(catalog.TRANSPORT_KINDS)}")
    console.print(f"deploy: {', '.join(catalog.DEPLOYER_KINDS)}")
    console.print(f"engine: {', '.join(catalog.ENGINE_KINDS)}")
    return 0
