"""``jaxcomposer fit CONFIG [--set key.path=value ...]`` and ``jaxcomposer methods``."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxcomposer", description="Composer's speedup methods in JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    p_fit = sub.add_parser("fit", help="train from a YAML config")
    p_fit.add_argument("config", help="path to a YAML config (see configs/)")
    p_fit.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. --set optimizer.lr=0.05 (repeatable; values are YAML)")
    sub.add_parser("methods", help="list every speedup method with a one-line description")
    args = parser.parse_args(argv)

    if args.command == "methods":
        from jaxcomposer.algorithms import describe_methods
        for name, line in describe_methods():
            print(f"{name:<22} {line}")
        return 0

    from jaxcomposer.config import ConfigError
    from jaxcomposer.runner import fit
    from jaxcomposer.trainer.trainer import Preempted
    try:
        result = fit(args.config, args.overrides)
    except ConfigError as e:
        print(f"jaxcomposer: {e}", file=sys.stderr)
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
