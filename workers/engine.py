"""``dressage-worker engine``: serve the CPU dev engine (SGLang's /generate protocol) over HTTP.

torch and transformers are imported inside the command, so the CLI starts fast for the other
sub-commands.
"""

from __future__ import annotations

import typer

from dressage.commandline import console as make_console
from dressage.commandline import handle_errors


@handle_errors
def engine_command(
    port: int = typer.Option(30000, help="TCP port to listen on (SGLang's default is 30000)."),
    host: str = typer.Option(
        "127.0.0.1", help="Interface to bind; 0.0.0.0 exposes the engine to the network."
    ),
    model: str = typer.Option("tiny", help="'tiny' (random Qwen3.5-MoE) or a Hugging Face model directory."),
    seed: int = typer.Option(
        0, help="Seed for the tiny model's weights and for requests without sampling_seed."
    ),
    weight_version: str = typer.Option("0", help="Initial weight version reported in every response."),
    threads: int = typer.Option(1, help="torch CPU threads."),
    constrained_json_disable_any_whitespace: bool = typer.Option(
        False,
        "--constrained-json-disable-any-whitespace",
        help="JSON-schema output without free whitespace (SGLang's flag of the same name).",
    ),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
) -> None:
    """Run the CPU dev engine until interrupted."""

    console = make_console(stderr=True)
    with console.status(f"building model {model!r} (seed {seed})"):
        import torch
        import uvicorn

        from dressage.engines.dev_engine import create_app
        from dressage.engines.tiny_model import load_model

        torch.set_num_threads(threads)
        loaded = load_model(model, seed=seed)
        app = create_app(
            loaded,
            seed=seed,
            weight_version=weight_version,
            constrained_json_disable_any_whitespace=constrained_json_disable_any_whitespace,
        )
    console.print(
        f"dev engine: model {loaded.model_path}, vocab {loaded.vocab_size}, listening on http://{host}:{port}"
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level)
