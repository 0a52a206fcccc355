"""Every failure of the `streammargin` command ends in one or two lines (cause, fix), a non-zero
exit code and no traceback, unless `--log-level DEBUG`."""

from __future__ import annotations

import argparse

import pytest

from connectors import cli
from connectors.cli import errors
from connectors.kafka.broker import free_port


def two_lines(err: str, prog: str) -> tuple[str, str]:
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith(f"{prog}: ") and lines[1].startswith("  fix: ")
    assert "Traceback" not in err
    return lines[0], lines[1]


@pytest.mark.parametrize(
    ("argv", "prog", "message"),
    [
        (["--bogus"], "streammargin", "required: command"),
        (["nosuchcommand"], "streammargin", "invalid choice"),
        (["evaluate", "--model", "alma", "--dataset", "Phishing", "-n", "many"],
         "streammargin evaluate", "invalid int value: 'many'"),
        (["evaluate", "--dataset", "Phishing"], "streammargin evaluate", "--model"),
        (["evaluate", "--model", "alma", "--dataset", "Phishing", "--on-bad-record", "ignore"],
         "streammargin evaluate", "invalid choice: 'ignore'"),
        (["demo", "--size", "ten"], "streammargin demo", "invalid int value"),
    ],
)
def test_a_bad_command_line_is_two_lines_not_the_whole_usage(argv, prog, message, capsys):
    assert cli.main(argv) == errors.EXIT_USAGE
    cause, fix = two_lines(capsys.readouterr().err, prog)
    assert message in cause
    assert f"{prog} --help" in fix


def test_help_still_exits_zero(capsys):
    assert cli.main(["evaluate", "--help"]) == 0
    assert "--one-hot" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--model", "nosuch"], "unknown model 'nosuch'"),
        (["demo", "--size", "10"], "--size 10"),
        (["demo", "--partitions", "0"], "--partitions 0"),
        (["demo", "--drift-param", "delta=0.1"], "--drift-param without --drift-detector"),
        (["demo", "--drift-detector", "nosuch"], "unknown drift detector"),
        (["demo", "--drift-detector", "adwin", "--drift-param", "delta=7"], "delta"),
    ],
)
def test_demo_refuses_bad_options_before_starting_anything(argv, message, capsys):
    assert cli.main(argv) == errors.EXIT_USAGE
    cause, _ = two_lines(capsys.readouterr().err, "streammargin demo")
    assert message in cause


def test_demo_without_a_broker_binary_says_how_to_get_one(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("STREAMMARGIN_TANSU", str(tmp_path / "no-tansu-here"))
    assert cli.main(["demo", "--out", str(tmp_path)]) == errors.EXIT_FAILURE
    cause, fix = two_lines(capsys.readouterr().err, "streammargin demo")
    assert "embedded Kafka broker did not start" in cause
    assert "streammargin[kafka]" in fix and "STREAMMARGIN_TANSU" in fix


def test_demo_on_apache_kafka_without_java_says_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java, no mvn
    assert cli.main(["demo", "--broker", "apache-kafka", "--out", str(tmp_path)]) == \
        errors.EXIT_FAILURE
    cause, fix = two_lines(capsys.readouterr().err, "streammargin demo")
    assert "Apache Kafka" in cause and "no java on PATH" in cause
    assert "JDK 17" in fix and "--broker tansu" in fix


def test_an_unwritable_plot_path_names_the_file(tmp_path, capsys):
    plot = tmp_path / "no" / "such" / "folder" / "curve.png"
    code = cli.main(["evaluate", "--model", "alma", "--dataset", "Phishing", "-n", "50",
                     "--plot", str(plot)])
    assert code == errors.EXIT_FAILURE
    err = capsys.readouterr().err
    cause, fix = two_lines(err[err.index("streammargin evaluate:"):], "streammargin evaluate")
    assert "No such file or directory" in cause and str(plot) in cause


def unreachable(args):
    from kafka import KafkaAdminClient

    KafkaAdminClient(bootstrap_servers=args.bootstrap_servers, bootstrap_timeout_ms=1500)


@pytest.mark.parametrize("log_level", ["INFO", "DEBUG"])
def test_an_unreachable_broker_is_two_lines_and_a_traceback_only_in_debug(log_level, capsys):
    args = argparse.Namespace(bootstrap_servers=f"127.0.0.1:{free_port()}", log_level=log_level)
    assert errors.run_command("streammargin kafka", unreachable, args) == errors.EXIT_FAILURE
    err = capsys.readouterr().err
    if log_level == "DEBUG":
        assert err.startswith("Traceback")
        err = err[err.index("streammargin kafka:"):]
    cause, fix = two_lines(err, "streammargin kafka")
    assert cause == f"streammargin kafka: cannot reach a Kafka broker at {args.bootstrap_servers}"
    assert "--bootstrap-servers" in fix


def test_an_unexpected_error_says_how_to_get_the_traceback(capsys):
    def broken(args):
        return {}["missing"]

    assert errors.run_command("streammargin x", broken, argparse.Namespace()) == errors.EXIT_FAILURE
    cause, fix = two_lines(capsys.readouterr().err, "streammargin x")
    assert "unexpected error: KeyError: 'missing'" in cause
    assert "--log-level DEBUG" in fix


def test_interrupt_exits_130(capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    assert errors.run_command("streammargin x", interrupted, argparse.Namespace()) == 130
    assert capsys.readouterr().err.strip() == "streammargin x: interrupted"
