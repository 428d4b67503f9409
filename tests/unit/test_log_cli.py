import io
import logging
import re

import pytest

from hami_agent import __version__, cli, log

pytestmark = pytest.mark.unit

KLOG_HEADER = re.compile(r"^([IWEF])(\d{4}) (\d\d:\d\d:\d\d\.\d{6}) +(\d+) ([\w.]+):(\d+)\] (.*)$")


def _capture(verbosity):
    stream = io.StringIO()
    logger = log.setup(verbosity, stream)
    return logger.getChild("test"), stream


def test_klog_header_matches_go_klog_layout():
    logger, stream = _capture(0)
    logger.info("Starting GRPC server for 'nvidia.com/gpu'")
    line = stream.getvalue().rstrip("\n")
    m = KLOG_HEADER.match(line)
    assert m, line
    assert m.group(1) == "I"
    assert m.group(5) == "test_log_cli.py"
    assert m.group(7) == "Starting GRPC server for 'nvidia.com/gpu'"


def test_verbosity_filters_v_levels_like_klog():
    logger, stream = _capture(2)
    log.v(logger, 2, "scoring shown")
    log.v(logger, 4, "filter hidden")
    logger.warning("warn")
    logger.error("err")
    out = stream.getvalue().splitlines()
    assert [line.split("] ", 1)[1] for line in out] == ["scoring shown", "warn", "err"]
    assert [line[0] for line in out] == ["I", "W", "E"]
    assert log.enabled(logger, 2) and not log.enabled(logger, 3)


def test_v_names_caller_file():
    logger, stream = _capture(5)
    log.v(logger, 5, "trace")
    assert "test_log_cli.py:" in stream.getvalue()
    assert "log.py" not in stream.getvalue()


def test_version_command(capsys):
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"hami-agent {__version__}"


def test_no_command_is_usage_error():
    assert cli.main([]) == cli.EXIT_USAGE


def test_unknown_command_exits_2():
    with pytest.raises(SystemExit) as exc:
        cli.main(["no-such-command"])
    assert exc.value.code == 2


def teardown_module():
    logging.getLogger(log.ROOT_LOGGER).handlers.clear()


def test_common_flags_include_node_config_with_env_fallback(monkeypatch):
    args = cli.build_parser().parse_args(["devices", "--node-config", "/config/config.json"])
    assert args.node_config == "/config/config.json"
    monkeypatch.setenv("NODE_CONFIG_FILE", "/etc/hami/node-config.json")
    args = cli.build_parser().parse_args(["device-plugin"])
    assert args.node_config == "/etc/hami/node-config.json"


def test_parser_for_one_subcommand_still_lists_every_subcommand(capsys):
    parser = cli.build_parser(["doctor", "cluster"])
    args = parser.parse_args(["doctor", "cluster", "--max-pods", "3"])
    assert args.max_pods == 3 and args.run.__module__ == "hami_agent.doctor.cmd"
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    listed = capsys.readouterr().out
    assert all(name in listed for name in cli.SUBCOMMANDS)
    # a command line without a (known) subcommand gets the full parser
    full = cli.build_parser(["--help"])
    assert full.parse_args(["scheduler"]).run.__module__ == "hami_agent.scheduler.serve.cmd"


def test_warn_once_logs_each_text_once_and_names_the_caller():
    logger, stream = _capture(0)
    warn = log.WarnOnce(logger)
    for _ in range(3):
        warn("driver 570.158.01 is a known-bad build")
        warn("GPU 1: MIG profile unknown")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    first = KLOG_HEADER.match(lines[0])
    assert first and first.group(1) == "W" and first.group(5) == "test_log_cli.py"
    assert first.group(7) == "driver 570.158.01 is a known-bad build"
