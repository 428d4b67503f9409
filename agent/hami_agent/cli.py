"""``hami-agent`` entry point: one binary, one subcommand per component.

Each subcommand lives in its feature package as a light ``cmd`` module exposing
``add_arguments(parser)`` and ``run(args) -> int``; heavy imports (kubernetes, grpc, pynvml) happen
inside ``run`` so ``hami-agent --help`` and ``hami-agent version`` stay fast.

Exit codes (every command): 0 ok, 1 failure found / operation failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from hami_agent import __version__, log

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

# name -> (module path, one-line help). Modules are imported only to build their parser.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "devices": ("hami_agent.nvml.cmd", "print the GPU inventory seen through NVML"),
    "device-plugin": ("hami_agent.deviceplugin.cmd", "run the kubelet device plugin"),
    "dra": ("hami_agent.dra.cmd", "run the DRA driver (ResourceSlices, kubelet DRA plugin, CDI)"),
    "scheduler": ("hami_agent.scheduler.serve.cmd", "run the scheduler extender and admission webhook"),
    "monitor": ("hami_agent.monitor.cmd", "export per-container vGPU metrics from shared regions"),
    "shrreg": ("hami_agent.shrreg.cmd", "inspect and repair HAMi-core shared regions"),
    "doctor": ("hami_agent.doctor.cmd", "diagnose HAMi problems and print the fix"),
}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags every subcommand accepts, with the same names and env fallbacks everywhere."""
    parser.add_argument("-v", "--v", dest="verbosity", type=int, metavar="N",
                        default=int(os.environ.get("HAMI_VERBOSITY", "0") or 0),
                        help="klog verbosity: 0 errors/info, 2 scoring, 4 filter/debug, 5 trace")
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                        help="kubeconfig file (default: in-cluster config, else $KUBECONFIG)")
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                        help="this node's Kubernetes name (env NODE_NAME)")
    parser.add_argument("--config", default=os.environ.get("CONFIG_FILE"),
                        help="agent config file: HAMi device-config.yaml or JSON (env CONFIG_FILE)")
    parser.add_argument("--node-config", default=os.environ.get("NODE_CONFIG_FILE"),
                        help="HAMi per-node config JSON, e.g. /config/config.json (env NODE_CONFIG_FILE)")


def _load(module_path: str):
    try:
        return importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        # Only hide the subcommand when its own package is absent (not yet built), never
        # when one of its dependencies is missing: that must surface as a real error.
        if exc.name and module_path.startswith(exc.name):
            return None
        raise


def _chosen(argv: Sequence[str] | None) -> str | None:
    """The subcommand a command line runs (its first word), or None (``--help``, no command, a typo)."""
    words = list(sys.argv[1:] if argv is None else argv)
    return words[0] if words and words[0] in SUBCOMMANDS else None


def _exists(module_path: str) -> bool:
    """Whether the subcommand's module is there, without importing it or its package (``find_spec`` would
    run the package's ``__init__``: NVML, shrreg)."""
    rel = module_path.split(".")[1:]  # below hami_agent
    return os.path.exists(os.path.join(os.path.dirname(__file__), *rel) + ".py")


def build_parser(argv: Sequence[str] | None = ()) -> argparse.ArgumentParser:
    """The full parser; with ``argv`` naming a subcommand, only that subcommand's module is imported and
    the others are listed by name and help only (importing all of them cost ~0.3 s of start-up, which
    a one-shot command such as ``doctor cluster`` pays on every run)."""
    chosen = _chosen(argv) if argv != () else None
    parser = argparse.ArgumentParser(
        prog="hami-agent",
        description="GPU device plugin, scheduler extender and node tooling, wire-compatible with HAMi.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    version = sub.add_parser("version", help="print the agent version")
    version.add_argument("--json", action="store_true", help="machine-readable output")
    version.set_defaults(run=_run_version)
    for name, (module_path, help_text) in SUBCOMMANDS.items():
        if chosen is not None and name != chosen:
            if _exists(module_path):  # not run by this command line: its flags are not needed
                sub.add_parser(name, help=help_text, description=help_text)
            continue
        module = _load(module_path)
        if module is None:
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_common_arguments(p)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def _run_version(args: argparse.Namespace) -> int:
    if args.json:
        import json

        print(json.dumps({"version": __version__}))
    else:
        print(f"hami-agent {__version__}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(build_parser(sys.argv[1:] if argv is None else argv), argv)


def dispatch(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse, set up logging and run the chosen subcommand with the shared exit-code rules
    (also used by the ``kubectl-hami`` entry point)."""
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    log.setup(getattr(args, "verbosity", 0))
    try:
        return int(run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
