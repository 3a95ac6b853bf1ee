"""Every example runs, exits 0 and prints the report at exit."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import orjson
import pytest

from tests.support.commands import EXAMPLES, run_example


def test_crawler_example_reports_every_stage(tmp_path: Path) -> None:
    report = tmp_path / "crawler.json"
    done = run_example(
        "crawler.py", "--workers", "4", ASYNCFLOW_FORMAT="json", ASYNCFLOW_OUTPUT=str(report)
    )
    assert "asyncflow: profiling 'crawler'" in done.stdout
    assert "crawled" in done.stdout
    document = orjson.loads(report.read_bytes())
    futures = {f["label"]: f for f in document["futures"]["futures"]}
    assert {"fetch", "parse", "crawl_one", "worker"} <= set(futures)
    assert futures["parse"]["outcomes"]["raised"] == 1  # the malformed page
    assert futures["worker"]["outcomes"]["cancelled"] == 4  # idle workers cancelled at the end
    assert futures["fetch"]["call_count"] == futures["crawl_one"]["call_count"]


def test_crawler_example_serves_the_endpoint_while_it_lingers() -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "crawler.py"), "--pages", "30", "--linger", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**clean, "ASYNCFLOW_PORT": "0", "ASYNCFLOW_FORMAT": "none"},
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        url = first.rsplit("endpoint: ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:")
        for line in process.stdout:
            if line.startswith("endpoint stays up"):
                break
        with urllib.request.urlopen(url + "/futures", timeout=10) as response:
            futures = orjson.loads(response.read())
        crawled = {f["label"]: f for f in futures["futures"]}
        assert crawled["fetch"]["call_count"] == crawled["crawl_one"]["call_count"] > 0
        with urllib.request.urlopen(url + "/loop", timeout=10) as response:
            assert orjson.loads(response.read())["loops"][0]["state"] in ("closed", "stopped")
    finally:
        process.kill()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def test_crawler_example_table_report_goes_to_stderr() -> None:
    done = run_example("crawler.py", "--pages", "20")
    assert done.stderr.startswith("asyncflow · crawler · elapsed")
    assert "\nfetch " in done.stderr


def test_pipeline_example_shows_the_slow_stage(tmp_path: Path) -> None:
    report = tmp_path / "pipeline.json"
    done = run_example(
        "pipeline.py", "--pages", "60", ASYNCFLOW_FORMAT="json", ASYNCFLOW_OUTPUT=str(report)
    )
    assert "stored 60 records" in done.stdout
    document = orjson.loads(report.read_bytes())
    channels = {c["label"]: c for c in document["channels"]["channels"]}
    assert channels["raw pages"]["sent_count"] == channels["raw pages"]["received_count"] == 60
    assert channels["records"]["max_queue_size"] == 8  # the queue before the slow stage fills
    assert channels["records"]["producers_blocked_ns"] > 0
    labels = {n["id"]: n["label"] for n in document["flow"]["nodes"]}
    edges = {(labels[e["source"]], labels[e["target"]]) for e in document["flow"]["edges"]}
    assert edges == {
        ("fetch", "raw pages"),
        ("raw pages", "parse"),
        ("parse", "records"),
        ("records", "store"),
    }


def test_memory_stream_example_reports_channel_and_stream() -> None:
    done = run_example("memory_stream.py")
    assert "received 300 readings" in done.stdout
    assert "\nreadings  bounded[4]   300       300" in done.stderr
    assert "\nsmoothed readings  exhausted    300" in done.stderr


def test_blocked_loop_example_names_the_blocking_line() -> None:
    done = run_example("blocked_loop.py", "--requests", "12")
    assert "served 12 requests" in done.stdout
    lines = [  # the episodes under the loop table (the warnings above it say it too)
        line
        for line in done.stderr.splitlines()
        if line.startswith("  loop ") and " blocked " in line
    ]
    assert len(lines) == 1  # only request 7 takes the synchronous path
    assert "by lookup at" in lines[0] and "(legacy_lookup): time.sleep(0.15)" in lines[0]


def test_slow_service_example_names_both_of_its_problems(tmp_path: Path) -> None:
    report = tmp_path / "orders.json"
    done = run_example(
        "slow_service.py", "--orders", "60", ASYNCFLOW_FORMAT="json", ASYNCFLOW_OUTPUT=str(report)
    )
    assert "shipped 60 orders" in done.stdout
    warnings = orjson.loads(report.read_bytes())["warnings"]
    found = {(w["kind"], w["severity"]) for w in warnings if w["active"]}
    assert {("bottleneck", "warning"), ("executor-saturated", "warning")} <= found
    (bottleneck,) = [w for w in warnings if w["kind"] == "bottleneck"]
    assert bottleneck["message"].startswith("`enrich` is the bottleneck")
    # nothing else above info: the example plants exactly these two
    assert {k for k, severity in found if severity != "info"} == {
        "bottleneck",
        "executor-saturated",
    }


def test_connection_pool_example_names_the_leaked_permits(tmp_path: Path) -> None:
    report = tmp_path / "pool.json"
    done = run_example("connection_pool.py", ASYNCFLOW_FORMAT="json", ASYNCFLOW_OUTPUT=str(report))
    assert "answers" in done.stdout
    document = orjson.loads(report.read_bytes())
    leaked = [w for w in document["warnings"] if w["kind"] == "permits-leaked"]
    assert [(w["severity"], w["subject"]["kind"]) for w in leaked] == [("error", "resource")]
    assert "calls of `handle` returned without releasing it" in leaked[0]["message"]
    # handle's calls that gave up waiting make a slow tail, the pool's consequence: no finding
    assert "tail-latency" not in {w["kind"] for w in document["warnings"]}
    (pool,) = [r for r in document["resources"]["resources"] if r["primitive"] == "semaphore"]
    assert pool["permits"]["available"] == 0 and len(pool["holders"]) == 4


def test_every_problem_example_gets_every_warning(tmp_path: Path) -> None:
    report = tmp_path / "every.json"
    run_example("every_problem.py", ASYNCFLOW_FORMAT="json", ASYNCFLOW_OUTPUT=str(report))
    warnings = orjson.loads(report.read_bytes())["warnings"]
    kinds = {w["kind"]: w for w in warnings}
    assert set(kinds) >= {
        "bottleneck",
        "cancellation-storm",
        "cancellation-swallowed",
        "channel-unread",
        "event-never-set",
        "executor-saturated",
        "lock-contention",
        "loop-blocked",
        "messages-lost",
        "never-awaited",
        "permits-leaked",
        "task-leak",
    }
    named = {kind: w["subject"]["label"] for kind, w in kinds.items()}
    assert (named["bottleneck"], named["cancellation-swallowed"]) == (
        f"every_problem.py:{line_of('raw: asyncio.Queue[int] = asyncio.Queue(2)')}",
        "poll_forever",
    )
    assert (named["task-leak"], named["never-awaited"]) == ("subscribe", "send_mail")
    # render_page's long poll is its blocking line's warning: one cause, one warning (on a
    # loaded machine another line may block the loop too, each its own warning)
    at = f"every_problem.py:{line_of('time.sleep(0.15)')}"
    (blocked,) = [
        w for w in warnings if w["kind"] == "loop-blocked" and w["subject"]["label"] == at
    ]
    assert "`render_page` blocked the event loop once" in blocked["message"]
    assert not [w for w in warnings if w["subject"]["label"] == "render_page"]


def line_of(text: str) -> int:
    lines = (EXAMPLES / "every_problem.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "3600", "soon"])
def test_crawler_example_refuses_a_timeout_that_is_not_a_usable_number(value: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "crawler.py"), "--timeout", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""  # refused before anything ran
    assert f"--timeout: must be a number of seconds in (0, 3600), not {value!r}" in done.stderr


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("crawler.py", ["--pages", "20"]),
        ("blocked_loop.py", ["--requests", "4"]),
        ("connection_pool.py", ["--requests", "20"]),
        ("loop_episodes.py", ["--stalls", "1"]),
        ("blocking_lines.py", ["--requests", "3"]),
        ("slow_service.py", ["--orders", "20"]),
    ],
)
def test_under_asyncflow_run_an_example_adds_no_start_line_of_its_own(
    name: str, args: list[str]
) -> None:
    """``asyncflow run`` says where the endpoint is; an example that said it too printed a
    second start line, with its own profile name beside the script's."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    done = subprocess.run(
        [sys.executable, "-m", "asyncflow", "run", "--format", "none", str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, "ASYNCFLOW_PORT": "0"},
    )
    assert done.returncode == 0, done.stderr
    said = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.startswith("asyncflow: profiling")
    ]
    assert said == [f"asyncflow: profiling {Path(name).stem!r}; endpoint: {said[0].split()[-1]}"]
    plain = run_example(name, *args, ASYNCFLOW_FORMAT="none")
    assert "asyncflow: profiling" in plain.stdout  # run by itself, it says where
