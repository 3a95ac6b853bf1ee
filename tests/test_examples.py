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
