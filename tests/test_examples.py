"""Every example runs, exits 0 and prints the report at exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run an example as a user would, with only the given ASYNCFLOW_* variables set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **env},
    )
    assert done.returncode == 0, done.stderr
    return done


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
