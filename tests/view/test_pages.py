"""The viewer's pages in headless Chromium, checked against the log (both backends)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.support.ui import Select

from dressage.tito.tokenizer import load_qwen35_tokenizer
from dressage.view.conversation import turn_views
from dressage.view.decode import TokenDecoder
from tests.view.browser import css, draw_tokens, one, severe_console_errors, text, url, wait
from tests.view.conftest import ViewedLog

# The first test of each backend builds the log: a real rollout (and, once per session, the dev
# engine shared with tests/rollout), which on a busy two-core machine can take minutes.
pytestmark = pytest.mark.timeout(900)


def test_runs_page_counts_match_the_log(viewed: ViewedLog, browser) -> None:
    browser.get(url(viewed.base, "/"))
    row = wait(
        browser,
        lambda d: [r for r in css(d, "#runs tbody tr") if r.get_attribute("data-run") == viewed.quick],
    )[0]
    cells = [text(c).strip() for c in css(row, "td")]
    summary = viewed.store.runs.summary(viewed.quick)
    assert summary.sessions == {"finished": 4, "failed": 2}
    assert cells[3] == "4" and cells[4] == "2"  # finished, failed
    assert cells[7] == f"{summary.tokens:,}"
    assert cells[8] == f"{100 * summary.trained_tokens / summary.tokens:.1f}%"
    assert cells[9] == f"{summary.mean_reward:.3g}"
    assert not severe_console_errors(browser)


def test_run_page_filters_sorts_pages_and_groups_failures(viewed: ViewedLog, browser) -> None:
    browser.get(url(viewed.base, "/run", name=viewed.quick))
    wait(browser, lambda d: css(d, "#sessions tbody tr"))
    assert text(one(browser, "#session-count")).startswith("6 sessions")
    failures = [[text(c).strip() for c in css(r, "td")] for r in css(browser, "#failures tbody tr")]
    assert failures[0][:4] == ["agent crash", "failed", "agent_crashed", "2"]
    # the reward curves are drawn by uPlot (canvas), one point per policy version / step
    wait(browser, lambda d: css(d, "#chart-version canvas") and css(d, "#chart-step canvas"))
    # filter by status through the form
    Select(one(browser, "select[name=status]")).select_by_visible_text("failed")
    one(browser, "form.filters button[type=submit]").click()
    wait(browser, lambda d: "status=failed" in d.current_url)
    statuses = {text(r.find_elements("css selector", "td")[6]) for r in css(browser, "#sessions tbody tr")}
    assert statuses == {"failed"}
    # sort by reward, descending (two clicks on the header), on the finished sessions
    browser.get(url(viewed.base, "/run", name=viewed.quick, status="finished"))
    one(browser, "#sessions th:nth-child(8) a").click()
    wait(browser, lambda d: "sort=reward" in d.current_url)
    one(browser, "#sessions th:nth-child(8) a").click()
    wait(browser, lambda d: "order=desc" in d.current_url)
    rewards = [
        float(text(r.find_elements("css selector", "td")[7])) for r in css(browser, "#sessions tbody tr")
    ]
    expected = sorted(
        (s.reward for s in viewed.store.sessions.list(viewed.quick, status="finished")), reverse=True
    )
    assert rewards == [float(f"{x:.3g}") for x in expected]
    # sort by a turn aggregate (tokens, computed per session on the server), descending
    browser.get(url(viewed.base, "/run", name=viewed.quick, sort="tokens", order="desc"))
    shown = [
        (r.get_attribute("data-session"), int(text(css(r, "td")[10]).replace(",", "")))
        for r in css(browser, "#sessions tbody tr")
    ]
    tokens = {
        s.id: sum(t.context_ids.size + t.generated_ids.size for t in viewed.store.turns.read(session_id=s.id))
        for s in viewed.store.sessions.list(viewed.quick)
    }
    assert shown == sorted(tokens.items(), key=lambda kv: (-kv[1], kv[0]))
    assert shown[-1][1] == 0  # the crashed sessions have no turns
    # server-side pages of 4
    browser.get(url(viewed.base, "/run", name=viewed.quick, per_page=4))
    assert len(css(browser, "#sessions tbody tr")) == 4
    one(browser, ".pager a[rel=next]").click()
    wait(browser, lambda d: "page=2" in d.current_url)
    assert len(css(browser, "#sessions tbody tr")) == 2
    # text search in the conversation: the crashing task's prompt is in no conversation (the agent
    # crashed before calling the model); a word of the first task's prompt is in its two sessions
    browser.get(url(viewed.base, "/run", name=viewed.quick, text="contains 'e'"))
    assert text(one(browser, "#session-count")).startswith("2 sessions matching")
    assert not severe_console_errors(browser)


def test_session_page_shows_the_conversation_and_tokens_of_the_log(viewed: ViewedLog, browser) -> None:
    session = viewed.store.sessions.list(viewed.quick, status="finished")[0]
    turns = viewed.store.turns.read(session_id=session.id, with_experts=False)
    decoder = TokenDecoder(load_qwen35_tokenizer().decode)
    expected = turn_views(turns, decoder)
    browser.get(url(viewed.base, "/session", id=session.id))
    spans = draw_tokens(browser)
    assert text(one(browser, "#session-id")) == session.id
    assert text(one(browser, "#status")) == "finished"
    assert float(text(one(browser, "#reward"))) == float(f"{session.reward:.4g}")
    # the conversation: the task prompt as the user message, the reply as decoded from the log
    users = [text(e) for e in css(browser, ".msg.role-user pre.content")]
    assert any("contains" in u for u in users)
    replies = [text(e) for e in css(browser, ".msg.role-assistant pre.content")]
    assert replies == [tv.reply.content for tv in expected if tv.reply is not None and tv.reply.content]
    head = text(one(browser, "#turn-0 .turn-head"))
    assert f"finish {turns[0].finish_reason}" in head and turns[0].info["dialect"] in head and " ms" in head
    # the token view: one span per piece, context vs generated, logprob and version on hover
    n_ctx = sum(len(decoder.pieces(t.context_ids)[0]) for t in turns)
    n_pieces = n_ctx + sum(len(decoder.pieces(t.generated_ids)[0]) for t in turns)
    assert len(spans) == n_pieces
    assert len(css(browser, "#tokens .tok.ctx")) == n_ctx
    gen = css(browser, "#tokens .tok.gen")[0]
    ActionChains(browser).move_to_element(gen).perform()
    tip = wait(browser, lambda d: one(d, "#tok-tip").is_displayed() and one(d, "#tok-tip"))
    _, starts = decoder.pieces(turns[0].generated_ids)
    start = int(starts[0])
    end = int(starts[1]) if len(starts) > 1 else int(turns[0].generated_ids.size)
    lp = float(np.min(turns[0].logprobs[start:end]))
    assert math.isclose(float(text(one(tip, ".tip-logprob")).split()[0]), round(lp, 4), abs_tol=1e-4)
    assert text(one(tip, ".tip-version")) == str(int(turns[0].policy_versions[start]))
    assert text(one(tip, ".tip-id")).startswith(str(int(turns[0].generated_ids[start])))
    # artifacts: the agent log opens as text
    names = [text(e) for e in css(browser, "#artifacts td.filename")]
    assert sorted(names) == ["agent.log", "workspace.tar.gz"]
    # the SQL link gives the queries for this session
    one(browser, "#sql-link").click()
    sql = wait(browser, lambda d: css(d, "#sql") and text(one(d, "#sql")))
    assert f"WHERE session_id = '{session.id}'" in sql and "token_events" in sql
    assert not severe_console_errors(browser)


def test_multi_lineage_session_shows_segments_lineages_and_experts(viewed: ViewedLog, browser) -> None:
    m = viewed.multi
    browser.get(url(viewed.base, "/session", id=m.session_id))
    # the token view draws a turn's tokens when it is scrolled near
    browser.execute_script("document.getElementById('tokens').scrollIntoView()")
    wait(browser, lambda d: css(d, "#tokens .turn-tokens:not(.pending) .tok"))
    draw_tokens(browser)
    rows = [[text(c).strip() for c in css(r, "td")] for r in css(browser, "#segments tbody tr")]
    assert [r[0] for r in rows] == ["0", "1", "2", "3", "4"]
    assert [r[1] for r in rows] == ["0", "1", "0", "0", "0"]  # the subagent has its own lineage
    assert [r[3] for r in rows] == [
        "-",
        "new_conversation",
        "retry",
        "template_prefix_mismatch",
        "client_disconnected",
    ]
    assert rows[2][2].startswith("branch") and rows[2][5] == "0"  # the retry branches from turn 0
    assert rows[4][2] == "abandoned by the client"
    turns = viewed.store.turns.read(session_id=m.session_id, with_experts=True)
    for row, seg in zip(rows, sorted({t.segment_index for t in turns}), strict=True):
        in_seg = [t for t in turns if t.segment_index == seg]
        assert row[6] == f"{sum(t.context_ids.size + t.generated_ids.size for t in in_seg):,}"
        assert row[7] == f"{sum(int(t.loss_mask.sum()) for t in in_seg):,}"
    assert len(css(browser, "#diagram circle")) == 6
    assert {text(e) for e in css(browser, "#diagram text.lane")} == {"thread 0", "thread 1"}
    assert len(css(browser, "#diagram circle.dead")) == 1
    # thinking is collapsed; the tool call shows with its arguments
    thinking = css(browser, "#turn-0 details.thinking")[0]
    assert thinking.get_attribute("open") is None
    assert text(one(browser, "#turn-0 .tool-call .fn")) == "read_file"
    assert '"path": "app.py"' in text(one(browser, "#turn-0 .tool-call .args"))
    assert next(text(e) for e in css(browser, "#turn-1 .msg.role-tool pre")).startswith("<script>")
    # hover a context token of turn 0: its routed experts come from the log
    first = next(e for e in css(browser, "#tokens .tok.ctx") if text(e).strip())
    ActionChains(browser).move_to_element(first).perform()
    wait(browser, lambda d: "L0:" in text(one(d, "#tok-tip .tip-experts")))
    pos = int(text(one(browser, "#tok-tip .tip-position")))
    experts = turns[0].routed_experts[pos]
    assert text(one(browser, "#tok-tip .tip-experts")).startswith(
        "L0:[" + ",".join(map(str, experts[0])) + "]"
    )
    # colour by policy version: turn 3 switched from version 0 to 1 inside the turn
    one(browser, "input[name=colour][value=version]").click()
    colours = browser.execute_script(
        "return Array.from(document.querySelectorAll('#tokens .tok.gen')).map(s => getComputedStyle(s).backgroundColor)"
    )
    assert len(set(colours)) == 2
    assert not severe_console_errors(browser)


def test_group_page_shows_samples_advantages_and_a_diff(viewed: ViewedLog, browser) -> None:
    steps = viewed.store.consumers.steps(viewed.quick, "train:main")
    # the first trained group: the crashing task's group is dropped (no advantages), and whether it
    # became ready before the others depends on timing
    step, group = next((s, g) for s in steps for g in s.manifest["groups"] if g.get("kept"))
    browser.get(url(viewed.base, "/group", run=viewed.quick, group=group["task_index"]))
    rows = wait(browser, lambda d: css(d, "#members tbody tr"))
    assert [r.get_attribute("data-session") for r in rows] == [m["session"] for m in group["members"]]
    rollout = {x["session"]: x["rollout_id"] for x in step.manifest["samples"]}
    for r, member in zip(rows, group["members"], strict=True):
        # the session's own reward; a failed member (which group forms first depends on timing: the
        # run has crashing and hanging tasks) has none in the log and shows "-", whatever the trainer used
        session = viewed.store.sessions.get(member["session"])
        if session.reward is None:
            assert session.status != "finished" and text(one(r, ".reward")) == "-"
        else:
            assert (
                float(text(one(r, ".reward")))
                == float(f"{session.reward:.4g}")
                == float(f"{member['reward']:.4g}")
            )
        adv = group["advantages"][str(rollout[member["session"]])]
        assert float(text(one(r, ".advantage"))) == float(f"{adv:.4g}")
    assert len(css(browser, ".side-by-side .column")) == len(rows)
    one(browser, "#diff-form button").click()
    diff = wait(browser, lambda d: css(d, "#diff") and text(one(d, "#diff")))
    a, b = (m["session"] for m in group["members"])
    assert diff.startswith(f"--- {a}\n+++ {b}")
    assert not severe_console_errors(browser)


def test_training_pages_link_steps_and_sessions_both_ways(viewed: ViewedLog, browser) -> None:
    steps = viewed.store.consumers.steps(viewed.quick, "train:main")
    assert len(steps) == 2
    browser.get(url(viewed.base, "/training", run=viewed.quick))
    rows = wait(browser, lambda d: css(d, "table.steps tbody tr"))
    assert [text(css(r, "td")[0]) for r in rows] == ["1", "2"]
    one(rows[1], "td a").click()
    wait(browser, lambda d: css(d, "#batch-hash"))
    assert text(one(browser, "#batch-hash")) == steps[1].batch_hash
    samples = css(browser, "#samples tbody tr")
    assert [s.get_attribute("data-session") for s in samples] == [
        x["session"] for x in steps[1].manifest["samples"]
    ]
    one(samples[0], "td a").click()  # step -> session
    used = wait(browser, lambda d: css(d, "#used-by a"))
    assert [text(a) for a in used] == ["train:main step 2"]
    used[0].click()  # session -> step
    wait(browser, lambda d: css(d, "#batch-hash"))
    assert text(one(browser, "#batch-hash")) == steps[1].batch_hash


def test_eval_sessions_are_kept_apart_from_training(viewed: ViewedLog, browser) -> None:
    """Run header, "Reward by policy version" and its table agree on the training-only mean (0.5 at
    v0, not the 0.25 a mix with eval would give); the eval curve is a second series; the sessions
    table has a kind column and filter; the group page lists no eval member."""
    ev = viewed.evals
    browser.get(url(viewed.base, "/run", name=ev.run))
    rows = wait(browser, lambda d: css(d, "#by-version tbody tr"))
    got = {
        int(str(r.get_attribute("data-version"))): (text(one(r, ".train")), text(one(r, ".eval")))
        for r in rows
    }
    assert got == {0: ("0.5", "0"), 1: ("-", "1")}
    assert text(one(browser, "#mean-reward")) == "0.5"
    assert viewed.store.runs.summary(ev.run).mean_reward == 0.5
    assert text(one(browser, "#eval-mean-reward")) == f"{sum(r for _, r in ev.evals.values()) / 3:.3g}"
    wait(browser, lambda d: css(d, "#chart-version canvas"))
    legend = [text(x).strip() for x in css(browser, "#chart-version .u-legend .u-label")]
    assert "training" in legend and "eval" in legend
    kinds = {
        r.get_attribute("data-session"): text(one(r, "td.kind")) for r in css(browser, "#sessions tbody tr")
    }
    assert {s for s, k in kinds.items() if k.startswith("eval")} == set(ev.evals)
    assert {kinds[s] for s in ev.evals} == {"eval v0", "eval v1"}
    Select(one(browser, "select[name=kind]")).select_by_visible_text("eval")
    one(browser, "form.filters button[type=submit]").click()
    wait(browser, lambda d: "kind=eval" in d.current_url)
    shown = {r.get_attribute("data-session") for r in css(browser, "#sessions tbody tr")}
    assert shown == set(ev.evals)
    browser.get(url(viewed.base, "/group", run=ev.run, group=0))
    members = wait(browser, lambda d: css(d, "#members tbody tr"))
    assert {r.get_attribute("data-session") for r in members} == set(ev.train)
    advantages = sorted(float(text(one(r, ".advantage"))) for r in members)
    assert advantages == [-0.5, 0.5]  # GRPO over the two training rewards only
    assert not severe_console_errors(browser)


def test_training_page_plots_step_metrics_and_the_eval_curve(viewed: ViewedLog, browser) -> None:
    """The quick run's steps (formed without a backend: batch metrics only) are plotted against the
    step, with their values in the steps table; the reward chart has a training and an eval series
    where the run has eval sessions."""
    metrics = viewed.store.consumers.metrics(viewed.quick, "train:main")
    assert sorted(metrics) == [1, 2]
    browser.get(url(viewed.base, "/training", run=viewed.quick))
    wait(browser, lambda d: css(d, "[data-metric=reward_mean] canvas") and css(d, "#chart-rewards canvas"))
    plotted = {x.get_attribute("data-metric") for x in css(browser, "[data-metric]")}
    assert {"reward_mean", "trained_tokens", "staleness_mean", "response_length_mean"} <= plotted
    assert "loss" not in plotted  # no backend, no loss
    assert all(css(x, "canvas") for x in css(browser, "[data-metric]"))
    cells = [text(one(r, ".reward-mean")) for r in css(browser, "table.steps tbody tr")]
    assert cells == [f"{metrics[s]['reward_mean']:.6g}" for s in (1, 2)]
    browser.get(url(viewed.base, "/training", run=viewed.evals.run))
    wait(browser, lambda d: css(d, "#chart-rewards canvas"))
    legend = [text(x).strip() for x in css(browser, "#chart-rewards .u-legend .u-label")]
    assert "training" in legend and "eval" in legend
    assert not severe_console_errors(browser)


def test_compare_page_overlays_runs_reward_and_eval_curves(viewed: ViewedLog, browser) -> None:
    browser.get(url(viewed.base, "/"))
    assert "/compare?runs=" in str(one(browser, "#compare-all").get_attribute("href"))
    browser.get(url(viewed.base, "/compare", runs=f"{viewed.quick},{viewed.evals.run}"))
    wait(browser, lambda d: css(d, "#chart-version canvas") and css(d, "#chart-step canvas"))
    legend = [text(x).strip() for x in css(browser, "#chart-version .u-legend .u-label")]
    assert {f"{viewed.quick} training", f"{viewed.evals.run} training", f"{viewed.evals.run} eval"} <= set(
        legend
    )
    rows = {
        r.get_attribute("data-series"): text(css(r, "td")[1])
        for r in css(browser, "#compare-series tbody tr")
    }
    assert rows[f"{viewed.evals.run} training"] == "v0: 0.5"
    assert rows[f"{viewed.evals.run} eval"] == "v0: 0, v1: 1"
    step_legend = [text(x).strip() for x in css(browser, "#chart-step .u-legend .u-label")]
    assert f"{viewed.quick} train:main" in step_legend
    assert not severe_console_errors(browser)


def _expected_reasons(turns: list, decoder: TokenDecoder) -> list[str]:
    """Per piece of a one-segment session, worked out by hand: context before the first generated
    token is the prompt, context after it was not generated, and generated tokens (all sampled by
    the policy the first step trains, recorded trainable) are trained."""
    out: list[str] = []
    seen_generated = False
    for t in sorted(turns, key=lambda x: x.turn_index):
        out += ["not_generated" if seen_generated else "prompt"] * len(decoder.pieces(t.context_ids)[0])
        out += ["trained"] * len(decoder.pieces(t.generated_ids)[0])
        seen_generated = seen_generated or t.generated_ids.size > 0
    return out


def test_token_view_colours_by_advantage_and_mask_reason(viewed: ViewedLog, browser) -> None:
    steps = viewed.store.consumers.steps(viewed.quick, "train:main")
    step, group = next((s, g) for s in steps for g in s.manifest["groups"] if g.get("kept"))
    member = group["members"][0]
    rewards = [viewed.store.sessions.get(m["session"]).reward for m in group["members"]]
    advantage = rewards[0] - sum(rewards) / len(rewards)  # GRPO, by hand from the log's rewards
    turns = viewed.store.turns.read(session_id=member["session"], with_experts=False)
    assert {t.segment_index for t in turns} == {0}
    decoder = TokenDecoder(load_qwen35_tokenizer().decode)
    browser.get(url(viewed.base, "/session", id=member["session"]))
    spans = draw_tokens(browser)
    assert f"trained at step {step.step} by train:main" in text(one(browser, ".seg-head"))
    reasons = browser.execute_script("return JSON.parse(document.getElementById('tokens').dataset.reasons)")
    codes = browser.execute_script(
        "return Array.from(document.querySelectorAll('#tokens .tok'))"
        ".map(s => (s.className.match(/\\bmr(\\d+)/) || [null, null])[1])"
    )
    assert len(codes) == len(spans)
    assert [reasons[int(c)] for c in codes] == _expected_reasons(turns, decoder)

    def backgrounds(selector: str) -> set[str]:
        return set(
            browser.execute_script(
                f"return Array.from(document.querySelectorAll('{selector}'))"
                ".map(s => getComputedStyle(s).backgroundColor)"
            )
        )

    one(browser, "input[name=colour][value=mask]").click()
    assert backgrounds("#tokens .tok.mr0") == {"rgb(187, 247, 208)"}  # trained
    assert backgrounds("#tokens .tok.mr1") == {"rgb(226, 232, 240)"}  # prompt
    assert one(browser, ".legend-mask").is_displayed()
    one(browser, "input[name=colour][value=advantage]").click()
    bucket, colour = (
        (4, "rgb(74, 222, 128)")
        if advantage > 0
        else (0, "rgb(248, 113, 113)")
        if advantage < 0
        else (2, "rgb(226, 232, 240)")
    )
    assert len(css(browser, f"#tokens .tok.av{bucket}")) == len(css(browser, "#tokens .tok.mr0")) > 0
    assert backgrounds("#tokens .tok.mr0") == {colour}
    assert backgrounds("#tokens .tok.mr1") == {"rgba(0, 0, 0, 0)"}  # only trained tokens carry A
    ActionChains(browser).move_to_element(css(browser, "#tokens .tok.mr0")[0]).perform()
    tip = wait(browser, lambda d: one(d, "#tok-tip").is_displayed() and one(d, "#tok-tip"))
    assert text(one(tip, ".tip-mask")) == "trained"
    assert float(text(one(tip, ".tip-advantage"))) == pytest.approx(advantage)
    # a session no step trained offers no such colouring
    failed = next(s for s in viewed.store.sessions.list(viewed.quick) if s.status != "finished")
    browser.get(url(viewed.base, "/session", id=failed.id))
    wait(browser, lambda d: css(d, "#tokens"))
    assert not css(browser, "input[name=colour][value=advantage]")
    assert not severe_console_errors(browser)
