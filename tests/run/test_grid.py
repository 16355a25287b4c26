"""Sweeps end to end: `make sweep` on the smoke study (its report beside its runs, the committed studies
untouched), MLflow's contents, resume after a kill, a browser.

These run the real thing -- a local Ray, Ray Tune driving trials (in the Tune trial's process), a real MLflow
server (the session's ``mlflow_server``), the frontier analysis -- on ``sweeps/smoke.yaml``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from isosweep.spec.grid import load_sweep
from isosweep.track import runs
from isosweep.track.curves import SweepData
from isosweep.trial.files import TrialDir
from sweep_helpers import (
    ISOSWEEP,
    LOOPBACK_ADDRESSES,
    ROOT,
    check_mlflow_matches_the_trials,
    children,
    env_for,
    listeners_while_running,
    record_models,
    signal_and_wait,
    wait_for,
)

SMOKE = ROOT / "sweeps" / "smoke.yaml"

pytestmark = pytest.mark.slow


def committed_studies() -> dict[str, str]:
    """Every file under the repository's dashboards/ and a hash of its bytes."""
    return {str(path.relative_to(ROOT)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted((ROOT / "dashboards").rglob("*")) if path.is_file()}


def test_make_sweep_smoke_prints_the_frontier_and_fills_mlflow(mlflow_server, tmp_path):
    """`make sweep` as a user runs it (no DASHBOARDS): the report lands beside the runs and in MLflow, and no
    committed study under dashboards/ changes."""
    uri, mlflow_env = mlflow_server
    runs_dir = tmp_path / "runs"
    command = ["make", "-s", "sweep", "BUDGET=2e3", f"SWEEP={SMOKE}", f"RUNS={runs_dir}"]
    env = {k: v for k, v in env_for(mlflow_env).items() if k != "DASHBOARDS"}
    committed = committed_studies()
    with open(tmp_path / "out.txt", "w") as stdout, open(tmp_path / "err.txt", "w") as stderr:
        sweep_proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, text=True)
        try:
            listening = listeners_while_running(sweep_proc)  # every socket its local Ray and trials listened on
            sweep_proc.wait(timeout=900)
        finally:
            sweep_proc.kill()
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert sweep_proc.returncode == 0, out[-3000:] + err[-3000:]
    # nothing listens beyond this machine: Ray's GCS, raylet, workers, agents and dashboard, the trials' torch
    # process groups -- all on 127.0.0.1 (the names show the sampling saw the sweep's Ray and its trials)
    assert {(ip, port, name) for ip, port, name in listening if ip not in LOOPBACK_ADDRESSES} == set()
    names = {name for _, _, name in listening}
    # a trial trains in its Tune trial's process (Ray's function trainable: comm "ray::ImplicitFu"), whose gloo
    # group listens on the loopback interface
    assert {"gcs_server", "raylet"} <= names and any("ImplicitFu" in name for name in names), sorted(listening)
    sweep = load_sweep(SMOKE, budget=2000)
    assert committed_studies() == committed  # not one file of the committed studies written
    beside = runs_dir / sweep.sweep_id / "frontier"  # the sweep's report, beside its trials, and where it says
    assert f"[sweep] frontier table, fits and plots: {beside} (report {beside / 'report.html'})" in out
    assert f"[sweep] {sweep.sweep_id}: isocompute study, 2 trials at C = 2,000" in out
    assert f"MLflow: {uri}" in out
    assert "2/2 trials done" in out
    assert "frontier of mean@4" in out and "fitted curves R(C)" in out
    table = out[out.index("frontier of mean@4"):].splitlines()
    assert table[1].split()[:3] == ["C", "best", "config"]
    rows = [line.split() for line in table[2:2 + sweep.spec.frontier.points]]
    compute = [float(row[0].replace(",", "")) for row in rows]
    assert compute == sorted(compute) and compute[-1] == 2000  # log-spaced up to the budget
    # then the allocation verdict, whichever the trials gave (which n wins depends on the base model a machine built)
    assert table[2 + sweep.spec.frontier.points].startswith(("n*(C)", "n* at the grid edge", "no saturation shown"))

    client = runs.client(uri)
    parent = runs.find_parent(client, sweep.sweep_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["isosweep.study"] == "isocompute"
    # its own link to the parent run, in the training view; none of MLflow's, which open the GenAI pages
    assert f"[sweep] open it in MLflow's UI: {runs.run_url(uri, client, parent.info.run_id)}" in out
    assert "View run" not in out + err and "View experiment" not in out + err
    check_mlflow_matches_the_trials(client, sweep, runs_dir)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "frontier")}
    assert {"frontier/frontier.csv", "frontier/fits.json", "frontier/frontier.png", "frontier/allocation.png",
            "frontier/report.html"} <= artifacts
    fits = json.loads(Path(client.download_artifacts(parent.info.run_id, "frontier/fits.json", str(tmp_path))).read_text())
    assert fits["budget"] == 2000 and set(fits["configs"]) == {"n4-Bp8", "n8-Bp8"}
    assert (beside / "report.html").exists()
    kept = SweepData.from_json(json.loads((beside / "curves.json").read_text()))  # as a study folder keeps them
    assert kept.sweep_id == sweep.sweep_id and kept.budget == 2000 and "frontier/curves.json" in artifacts
    assert {c.config for c in kept.curves} == {"n4-Bp8", "n8-Bp8"} and kept.trial_params["task.name"] == "arithmetic"
    for run in children(client, sweep.sweep_id):  # the first record breaks the (empty) record: a logged model
        assert 0 in record_models(client, run.info.run_id)
    # the winner's best checkpoint at each C of the primary frontier is a version of the sweep's registered model
    # (the smoke sweep's five evaluations are often too few to fit: then there is no winner, and none registered)
    frontier_csv = (beside / "frontier.csv").read_text()
    with open(beside / "frontier.csv") as table:
        winners = {f"{float(row['C']):.0f}": row["config"] for row in csv.DictReader(table)
                   if row["metric"] == "mean@4" and row["config"]}
    name = runs.registered_model_name(sweep.sweep_id)
    versions = client.search_model_versions(f"name = '{name}'")
    assert {v.tags["isosweep.C"]: v.tags["isosweep.config"] for v in versions} == winners
    assert len(versions) == len(winners)
    assert ("the winner's best checkpoint at each C" in out) == bool(winners)
    if "2000" in winners:
        assert client.get_model_version_by_alias(name, "budget").tags["isosweep.C"] == "2000"

    # `isosweep frontier` redoes the analysis from MLflow alone: no trial directory needed
    shutil.rmtree(runs_dir)
    again = subprocess.run([ISOSWEEP, "frontier", sweep.sweep_id[:12], "--out", str(tmp_path / "again")],
                           cwd=ROOT, env=env_for(mlflow_env), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "again" / "frontier.csv").read_text() == frontier_csv
    first_table = out[out.index("frontier of mean@4"):out.index("[sweep] frontier table")].strip()
    assert first_table in again.stdout

    # `make report` redoes every finished sweep's study folder from MLflow, then the study report
    refreshed = tmp_path / "refreshed"
    report = subprocess.run([ISOSWEEP, "report", "--refresh", "--dashboards", str(refreshed)], cwd=ROOT,
                            env=env_for(mlflow_env), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    assert (refreshed / "smoke" / "frontier.csv").read_text() == frontier_csv
    label = "`smoke` (easy, C = 2,000, 2 configs, 1 seed; eval 32 problems x 4 samples"
    assert label in (refreshed / "REPORT.md").read_text()
    assert len(client.search_model_versions(f"name = '{name}'")) == len(winners)  # redone twice, registered once

    # a folder is redone from the sweep its fits.json names, whatever the folder is called (no second folder for
    # that sweep appears under its name); a folder whose sweep MLflow does not hold is left as it was, and says so
    kept = tmp_path / "kept"
    shutil.copytree(refreshed / "smoke", kept / "smoke-renamed")
    (kept / "smoke-renamed" / "frontier.csv").write_text("stale\n")
    (kept / "gone").mkdir()
    gone = json.dumps({**json.loads((refreshed / "smoke" / "fits.json").read_text()), "title": "gone-2k-000000"})
    (kept / "gone" / "fits.json").write_text(gone)
    again = subprocess.run([ISOSWEEP, "report", "--refresh", "--dashboards", str(kept)], cwd=ROOT,
                           env=env_for(mlflow_env), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (kept / "smoke-renamed" / "frontier.csv").read_text() == frontier_csv
    assert not (kept / "smoke").exists() and (kept / "gone" / "fits.json").read_text() == gone
    assert "gone: left as it was: its sweep(s) gone-2k-000000 are not among the finished sweeps" in again.stdout
    assert f"smoke-renamed: sweep(s) {sweep.sweep_id} redone from MLflow" in again.stdout


def test_an_interrupted_or_killed_sweep_resumes_without_repeating_work(mlflow_server, tmp_path):
    uri, mlflow_env = mlflow_server
    budget = 4000  # evaluations at 0, 400, 713, 1,265, 2,250 and 4,000 rollouts: killed after the 2nd, then the 4th
    sweep = load_sweep(SMOKE, budget=budget)
    runs_dir = tmp_path / "runs"
    command = [ISOSWEEP, "sweep", str(SMOKE), "--budget", str(budget), "--runs", str(runs_dir), "--no-dashboards",
               "--progress-every", "5"]
    trials = {p.key: runs_dir / sweep.sweep_id / "trials" / p.key for p in sweep.trials}

    def evaluated_past(n_records: int):
        return lambda: any(len(TrialDir(d).records()) >= n_records for d in trials.values())

    logs = []
    for sig, n_records in ((signal.SIGINT, 2), (signal.SIGKILL, 4)):  # Ctrl-C, then a killed driver
        log = open(tmp_path / f"driver-{sig.name}.log", "w")
        logs.append(log.name)
        proc = subprocess.Popen(command, cwd=ROOT, env=env_for(mlflow_env), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(evaluated_past(n_records), 600, f"{n_records} evaluations of a trial")
            waited = signal_and_wait(proc, sig)  # and the old Ray session's workers gone
            print(f"[test] {sig.name}: its Ray was gone {waited:.1f} s after the driver exited")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert not all(len(TrialDir(d).records()) and TrialDir(d).records()[-1]["rollouts"] >= budget - 64 for d in trials.values())

    before = {key: TrialDir(d).records() for key, d in trials.items()}
    done = subprocess.run(command, cwd=ROOT, env=env_for(mlflow_env), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "frontier of mean@4" in done.stdout
    resumed = 0
    for key, folder in trials.items():
        after = TrialDir(folder).records()
        kept = [r for r in before[key] if r["step"] <= after[-1]["step"]]
        # what was evaluated before the kill is still there, unchanged, up to the resumed checkpoint
        assert after[:len(kept)] == kept or len(kept) > len(after[:len(kept)])
        log = (folder / "trial.log").read_text()
        resumed += "resuming at step" in log
    assert resumed >= 1
    client = runs.client(uri)
    check_mlflow_matches_the_trials(client, sweep, runs_dir)
    assert runs.find_parent(client, sweep.sweep_id).info.status == "FINISHED"

    # and once finished, the same command trains nothing again
    mtimes = {key: (d / "metrics.jsonl").stat().st_mtime for key, d in trials.items()}
    again = subprocess.run(command, cwd=ROOT, env=env_for(mlflow_env), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "(2 already finished)" in again.stdout
    assert {key: (d / "metrics.jsonl").stat().st_mtime for key, d in trials.items()} == mtimes
    assert len(children(client, sweep.sweep_id)) == 2


def chromium_driver():
    """Headless Chromium (Debian's chromium + chromium-driver) through Selenium, or a skip saying why."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (browser and driver):
        pytest.skip("no browser: install Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    options = Options()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


def keep_screenshots(folder: Path) -> None:
    """The browser test's screenshots, copied to ``$ISOSWEEP_TEST_ARTIFACTS`` when it is set (CI keeps that
    folder; ``make ui-screenshot`` takes the README's picture from it)."""
    target = os.environ.get("ISOSWEEP_TEST_ARTIFACTS")
    if target and folder.exists():
        Path(target).mkdir(parents=True, exist_ok=True)
        for shot in folder.glob("*.png"):
            shutil.copy(shot, Path(target) / shot.name)


def test_a_browser_lands_on_the_runs_and_finds_the_frontier_plot_and_the_registry(mlflow_server, tmp_path):
    """What `make ui` opens, in a browser MLflow has never seen: the experiment's runs table (not MLflow's GenAI
    pages) with the smoke sweep and its trials; the parent run's frontier plot under Artifacts; the trials'
    record checkpoints under Models (and the sweep's registered model, if its frontier had a winner).
    Screenshots of each go to ``tmp_path/screenshots`` (and ``$ISOSWEEP_TEST_ARTIFACTS``)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    uri, mlflow_env = mlflow_server
    client = runs.client(uri)
    sweep = load_sweep(SMOKE, budget=2000)
    parent = runs.find_parent(client, sweep.sweep_id)
    if parent is None or parent.info.status != "FINISHED":
        done = subprocess.run([ISOSWEEP, "sweep", str(SMOKE), "--budget", "2000", "--runs", str(tmp_path / "runs"),
                               "--no-dashboards"], cwd=ROOT, env=env_for(mlflow_env), capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        parent = runs.find_parent(client, sweep.sweep_id)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    browser = chromium_driver()
    body = lambda b: b.find_element(By.TAG_NAME, "body").text  # noqa: E731
    click = lambda text: browser.find_element(By.XPATH, f"//*[normalize-space(text())='{text}']").click()  # noqa: E731
    try:
        browser.get(runs.run_url(uri, client, parent.info.run_id))  # the link a sweep prints at its end
        WebDriverWait(browser, 120).until(lambda b: "Artifacts" in body(b) and sweep.sweep_id in body(b))
        assert "Model registry" in body(browser) and "Token Usage" not in body(browser)  # training pages
        browser.save_screenshot(str(shots / "mlflow-parent-run.png"))
        browser.get(runs.experiment_url(uri, client))
        WebDriverWait(browser, 120).until(lambda b: sweep.sweep_id in body(b) and "Run Name" in body(b))
        assert "/runs?workflowType=machine_learning" in browser.current_url
        assert "Model registry" in body(browser) and "Token Usage" not in body(browser)  # training pages, not GenAI's
        # What choosing "Model training" on the sidebar's switch stores, so MLflow keeps to the training pages
        # as one clicks on (a link without workflowType= falls back to it), and its assistant panel closed.
        browser.execute_script("localStorage.setItem('mlflow.workflowType_v1', '\"machine_learning\"');"
                               "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');")
        browser.refresh()
        WebDriverWait(browser, 120).until(lambda b: sweep.sweep_id in body(b))
        row = f"//div[@role='row'][.//*[normalize-space(text())='{sweep.sweep_id}']]"
        browser.find_element(By.XPATH, f"{row}//button[contains(@data-component-id, 'runnamecellrenderer')]").click()
        WebDriverWait(browser, 60).until(lambda b: all(p.key in body(b) for p in sweep.trials))  # its trials
        browser.save_screenshot(str(shots / "mlflow-runs.png"))

        click(sweep.sweep_id)  # the parent run's page
        WebDriverWait(browser, 90).until(lambda b: "Artifacts" in body(b) and parent.info.run_id in b.current_url)
        click("Artifacts")
        WebDriverWait(browser, 90).until(lambda b: "frontier" in body(b))
        click("frontier")
        WebDriverWait(browser, 60).until(lambda b: "frontier.png" in body(b))
        click("frontier.png")
        WebDriverWait(browser, 60).until(lambda b: "frontier/frontier.png" in body(b))

        def shown(b) -> bool:  # the plot itself, decoded by the browser
            return any((img.get_attribute("src") or "").startswith("blob:")
                       and b.execute_script("return arguments[0].naturalWidth", img) > 200
                       for img in b.find_elements(By.TAG_NAME, "img"))

        WebDriverWait(browser, 60).until(shown)
        assert "Model registry" in body(browser) and "Evaluation runs" not in body(browser)
        browser.save_screenshot(str(shots / "mlflow-frontier.png"))

        browser.find_element(By.XPATH, "//a[normalize-space(.)='Models']").click()  # the trials' record checkpoints
        WebDriverWait(browser, 90).until(lambda b: all(f"{p.key}-rollouts-000000000" in body(b) for p in sweep.trials))
        browser.save_screenshot(str(shots / "mlflow-models.png"))
        name = runs.registered_model_name(sweep.sweep_id)
        if client.search_model_versions(f"name = '{name}'"):  # the frontier had a winner (see the test above)
            browser.get(f"{uri}/#/models/{name}")
            WebDriverWait(browser, 90).until(lambda b: name in body(b) and "Version 1" in body(b))
            browser.save_screenshot(str(shots / "mlflow-registry.png"))
    finally:
        browser.save_screenshot(str(shots / "last.png"))
        browser.quit()
        keep_screenshots(shots)


def test_the_parts_of_a_study_run_seed_by_seed_are_pooled_into_the_first_parts_folder(tmp_path):
    """Two sweeps of one design (seeds 0-1 and 2-3) and one of another budget, as `make report` reads them:
    one pooled analysis in the folder of the part with the lowest seed, naming both parts; the other alone."""
    from types import SimpleNamespace

    import numpy as np

    from isosweep.experiments.stats_validation import BUDGET, SYNTHETIC_PARAMS, TRUTH, synthetic_sweep
    from isosweep.run.grid import pool_dashboards

    def part(sweep_id: str, name: str, first_seed: int, budget: int = BUDGET, rng: int = 0):
        curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(rng))
        for c in curves:
            c.fields["seed"] += first_seed
            c.key = f"{c.config}-s{c.fields['seed']}"
        params = {"spec.name": name, "spec.frontier.points": "4", "spec.frontier.bootstrap": "5"}
        parent = SimpleNamespace(data=SimpleNamespace(params=params, tags={
            runs.SWEEP_TAG: sweep_id, "isosweep.study": "isocompute", "isosweep.metric": "eval/mean@4",
            "isosweep.difficulty": "easy"}))
        return parent, SweepData(sweep_id, budget, dict(SYNTHETIC_PARAMS), {"spec.study": "isocompute"}, curves)

    read = {"later-b": part("later-b", "study-seeds23", 2, rng=1), "first-a": part("first-a", "study", 0, rng=2),
            "other-c": part("other-c", "other", 0, budget=BUDGET // 2, rng=3)}
    lines = []
    assert pool_dashboards(read, tmp_path, lines.append) == [tmp_path / "study"]
    fits = json.loads((tmp_path / "study" / "fits.json").read_text())
    assert fits["pooled_from"] == ["first-a", "later-b"] and fits["title"] == "first-a"
    assert fits["seeds"] == [0, 1, 2, 3] and fits["trials"] == 2 * len(read["first-a"][1].curves)
    assert "sweeps first-a, later-b pooled" in lines[0] and not (tmp_path / "other").exists()
