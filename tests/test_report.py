"""``llm-envs report``: the HTML page of a run (config, curves, eval table, transcripts before/after
with the changed words marked), self-contained, and its errors. The page in a real browser:
tests/test_report_browser.py (slow)."""

from __future__ import annotations

import html
import json
import re

import pytest
from test_magrpo import tiny_config

from baselines.infra.cli import main
from baselines.infra.report import build_report, diff_html, write_report
from baselines.infra.samples import SAMPLES_FILE, read_samples
from baselines.learners import magrpo


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory):
    config = tiny_config(tiny_model_dir, tmp_path_factory.mktemp("report"), num_eval_problems=2, samples_every=1,
                         learning_rate=0.05)
    magrpo.main(config)
    return config.run_dir()


def test_report_holds_config_curves_eval_and_transcripts(run_dir):
    page = build_report(run_dir)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # Self-contained: no script, no stylesheet or image or font fetched, nothing from the network.
    assert "<script" not in page and "<link" not in page and "<img" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert not re.search(r"url\((?!#)", page)  # the SVG's clip paths refer to ids inside the page only
    assert page.count("<svg") == 1 and "<!DOCTYPE svg" not in page  # the curves, inline
    assert "<h1>magrpo · writing/xsum-v0 · run</h1>" in page
    assert "<td>learning_rate</td><td>0.05</td>" in page  # the config, from the checkpoint

    records = read_samples(run_dir)
    before = [r for r in records if r["kind"] == "eval" and r["phase"] == "before"]
    after = [r for r in records if r["kind"] == "eval" and r["phase"] == "after"]
    assert len(before) == len(after) == 2
    assert page.count('<div class="problem"') == 2
    for b, a in zip(before, after):
        assert f"<h3>Problem {b['task_index']} · reward {b['reward']:.3f} → {a['reward']:.3f}" in page
        for record in (b, a):
            for role, text in record["turns"][0]["responses"].items():
                # every word of every response is on the page (escaped; changed words sit in <ins>/<del>)
                for word in text.split()[:5]:
                    assert html.escape(word) in page, (role, word)
        left, right = diff_html(b["turns"][0]["responses"]["brief"], a["turns"][0]["responses"]["brief"])
        assert left in page and right in page
        assert html.escape(b["turns"][0]["prompts"]["brief"]) in page  # prompts, in a <details>
    train = [r for r in records if r["kind"] == "train"]
    assert "<h2>Training samples</h2>" in page and "iteration 2: " in page and train


def test_diff_marks_only_changed_words_and_escapes():
    assert diff_html("same words", "same words") == ("same words", "same words")
    left, right = diff_html("keep <b>old</b> end", "keep new & end")
    assert left == "keep <del>&lt;b&gt;old&lt;/b&gt;</del> end" and right == "keep <ins>new &amp;</ins> end"
    assert diff_html("", "all new") == ("", "<ins>all new</ins>")
    assert diff_html("a  b", "a b") == ("a  b", "a b")  # whitespace alone is not marked


def test_script_in_a_response_stays_text(run_dir, tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    lines = (copy / SAMPLES_FILE).read_text().splitlines()
    first = json.loads(lines[0])
    first["turns"][0]["responses"]["brief"] = "<script>alert(1)</script>"
    (copy / SAMPLES_FILE).write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    page = build_report(copy)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_report_of_partial_runs_and_errors(run_dir, tmp_path):
    import shutil

    partial = tmp_path / "partial"
    shutil.copytree(run_dir, partial)
    (partial / SAMPLES_FILE).unlink()
    shutil.rmtree(partial / "checkpoints")
    page = build_report(partial)
    assert "has no samples.jsonl" in page and "No checkpoint with a config" in page and "<svg" in page
    with pytest.raises(FileNotFoundError, match="not found"):
        build_report(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds neither metrics.jsonl nor samples.jsonl"):
        build_report(tmp_path / "empty")
    out = write_report(run_dir, tmp_path / "sub" / "r.html")
    # Bytes, not read_text: a sampled response may hold a carriage return, which universal newlines
    # would turn into a line feed on the way back.
    assert out.read_bytes().decode("utf-8") == build_report(run_dir)


def test_cli_report(run_dir, tmp_path, capsys):
    assert main(["report", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "report.html")
    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-envs report: error: run directory") and err.count("\n") == 1
