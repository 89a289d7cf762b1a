"""``jaxcomposer fit CONFIG [--OPTION VALUE ...] [--set key.path=value ...]`` and ``jaxcomposer methods``.

Every config option (``jaxcomposer.options``) is also a flag of ``fit``: ``--max_duration 2ep``,
``--data.batch_size 64``, ``--optimizer '{name: adam, lr: 0.001}'``. Values are read as YAML, and a flag wins over
the file, exactly as ``--set max_duration=2ep`` would.
"""
from __future__ import annotations

import argparse
import json
import sys

from jaxcomposer.launch import add_launch_parser, run_from_args
from jaxcomposer.options import CONFIG_COMPONENTS, DATA_OPTIONS, PROCESS_OPTIONS, RUN_OPTIONS, Option


def _add_option_flags(group: argparse._ArgumentGroup, options: tuple[Option, ...], prefix: str = "") -> None:
    for o in options:
        key = prefix + o.name
        flags = [f"--{key}"] + ([f"--{key.replace('_', '-')}"] if "_" in key else [])
        default = o.default_in_config
        shown = f" (default: {default!r})" if isinstance(default, (str, int, float)) else ""
        group.add_argument(*flags, dest=f"option:{key}", metavar="VALUE", default=None,
                           help=f"{o.doc}{shown}".replace("%", "%%"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxcomposer", description="Composer's speedup methods in JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    p_fit = sub.add_parser("fit", help="train from a YAML config",
                           usage="jaxcomposer fit CONFIG [--OPTION VALUE ...] [--set KEY=VALUE ...]",
                           description="Train from a YAML config (see configs/). Every key of the config is also a "
                                       "flag below; a flag's value is YAML and wins over the file.")
    p_fit.add_argument("config", help="path to a YAML config (see configs/)")
    p_fit.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override any config value by its dotted path, e.g. --set optimizer.lr=0.05 "
                            "(repeatable; values are YAML)")
    _add_option_flags(p_fit.add_argument_group("run options"), RUN_OPTIONS + PROCESS_OPTIONS)
    _add_option_flags(p_fit.add_argument_group("components (YAML; --set reaches inside them)"), CONFIG_COMPONENTS)
    _add_option_flags(p_fit.add_argument_group("data"), DATA_OPTIONS, prefix="data.")
    p_methods = sub.add_parser("methods", help="list every speedup method, or print one method's card")
    p_methods.add_argument("name", nargs="?", help="a method (e.g. ema, LabelSmoothing): print its method card")
    add_launch_parser(sub)  # last: it checks its command against every subcommand registered before it
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    if args.command == "launch":  # N processes of `jaxcomposer <rest>` (jaxcomposer.launch); JAX is not loaded here
        return run_from_args(args)

    if args.command == "methods":
        from jaxcomposer.algorithms import describe_methods, method_card
        if args.name is None:
            for name, line in describe_methods():
                print(f"{name:<22} {line}")
            return 0
        card = method_card(args.name)
        if card is None:
            known = ", ".join(name for name, _ in describe_methods())
            print(f"jaxcomposer: no method {args.name!r}; known: {known}", file=sys.stderr)
            return 2
        print(card)
        return 0

    from jaxcomposer.errors import JaxComposerError, Preempted
    from jaxcomposer.launch import initialize_from_env
    try:  # started by `jaxcomposer launch` (or srun / mpirun): join the other processes before JAX computes anything
        initialize_from_env()
    except JaxComposerError as e:
        print(f"jaxcomposer: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    from jaxcomposer.runner import fit
    flags = [f"{dest.removeprefix('option:')}={value}" for dest, value in vars(args).items()
             if dest.startswith("option:") and value is not None]
    try:
        result = fit(args.config, flags + args.overrides)
    except JaxComposerError as e:  # bad config, arguments, data or checkpoint: one message, no traceback
        print(f"jaxcomposer: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except Preempted as e:  # SIGTERM -> 143, SIGINT -> 130, after the current step was saved
        print(f"jaxcomposer: {e}", file=sys.stderr)
        return e.exit_code
    summary = {"metrics": result.metrics, "wall_time_s": round(result.wall_time_s, 1), "run_dir": str(result.run_dir)}
    if result.fallback_note:
        summary["note"] = result.fallback_note
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
