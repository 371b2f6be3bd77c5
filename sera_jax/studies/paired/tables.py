"""Tables: `comparison.md` from a `comparison.json` table (pass@k with the start and the
blind control, paired differences with CIs, noise floors, the null
control, the allocator, and the curve analysis: primary endpoint, gate, A/A, Δ(t))."""

from __future__ import annotations

from typing import Any

import numpy as np

from sera_jax.studies.paired.kinds import words
from sera_jax.studies.paired.spec import EXPLORATORY, SPLIT_NAMES, SPLITS


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}"


def answers_markdown(table: dict[str, Any]) -> list[str]:
    """What the policies write at the last point (held-out): mean answer length in tokens
    and the share of answers cut at the token cap, mean ± std over seeds; [] for tables
    recorded before these fields."""
    rows = [(arm, e) for arm, e in table["methods"].items()
            if e.get("truncated_fraction") is not None]
    start = table["sft"]
    if not rows or start.get("truncated_fraction") is None:
        return []

    def f(e: Any, scale: float = 1.0) -> str:
        return (f"{scale * e:.1f}" if isinstance(e, int | float) else
                f"{scale * e['mean']:.1f} ± {scale * e['std']:.1f}")

    w = words(table.get("study"))
    lines = ["", f"**Answers** (held-out, step {table['num_steps']}, mean ± std over seeds):",
             "", "| policy | mean length, tokens | truncated at the cap, % |", "|---|---|---|",
             f"| {w.start} | {f(start['answer_length'])} | {f(start['truncated_fraction'], 100)} |"]
    lines += [f"| {arm} | {f(e['answer_length'])} | {f(e['truncated_fraction'], 100)} |"
              for arm, e in rows]
    return lines


def comparison_markdown(table: dict[str, Any]) -> str:
    """The pass@k table (percent, mean ± std over seeds) with matched rollouts / tokens, the
    paired differences with CIs and verdicts, the noise floor, the null control and the
    allocator diagnostics."""
    ks = list(table["sft"]["pass_at_k"])
    n_steps = table["num_steps"]
    w = words(table.get("study"))
    head = "| method | seeds | " + " | ".join(f"pass@{k}" for k in ks) + \
        " | generated rollouts | generated tokens |"
    lines = [head, "|" + "---|" * (len(ks) + 4)]
    if table.get("exploratory"):
        lines = [exploratory_banner(), "", *lines]
    lines.append(f"| {w.start_row.format(step=n_steps)} | – | " + " | ".join(
        _pct(table["sft"]["pass_at_k"][k]) for k in ks) + " | 0 | 0 |")
    lines.append(blind_row(table, ks, f"| blind ({w.blind} guesser, exact) | – | ",
                           " | – | – |"))
    for method, e in table["methods"].items():
        cells = [f"{_pct(e['pass_at_k'][k]['mean'])} ± {_pct(e['pass_at_k'][k]['std'])}"
                 if k in e["pass_at_k"] else "–" for k in ks]
        lines.append(f"| {method} | {len(e['seeds'])} | " + " | ".join(cells) +
                     f" | {e['rollouts']['mean']:,.0f} | {e['tokens']['mean']:,.0f} ± "
                     f"{e['tokens']['std']:,.0f} |")
    lines.append("")
    lines.append(f"Held-out {w.prompts} ({table['num_prompts']['eval']}), n = "
                 f"{table['num_samples']} samples per {w.prompt} at the final step ({n_steps} "
                 "RL steps), every row scored with the same keys; mean ± sample std over seeds, "
                 f"percent. Blind: {w.blind_policy} (exact pass@k, no sampling noise).")
    lines += ["", validity_sentence(table)]
    floor = table["noise_floor"]
    for split in SPLITS:
        if split not in floor:
            continue
        name = SPLIT_NAMES[split]
        lines += ["", f"**Paired differences on {name} {w.prompts}** (percentage points, mean "
                  f"[95 % CI]; noise floor = one policy, two key sets):", "",
                  "| comparison | " + " | ".join(f"pass@{k}" for k in ks) + " |",
                  "|" + "---|" * (len(ks) + 1),
                  f"| noise floor ({w.start}, keys A − keys B) | " + " | ".join(
                      f"{_pct(floor[split][k]['diff'])} (±{_pct(floor[split][k]['floor'])})"
                      for k in ks) + " |"]
        paired_floor = table.get("noise_floor_paired", {})
        if split in paired_floor:
            lines.append(f"| noise floor, paired ({paired_floor['pair']}, shared keys A − "
                         f"keys B, {len(paired_floor['seeds'])} seeds) | " + " | ".join(
                             f"{_pct(paired_floor[split][k]['diff'])} "
                             f"(±{_pct(paired_floor[split][k]['floor'])})" for k in ks) + " |")
        for arm, p in table.get("paired", {}).items():
            if split in p:
                lines.append(f"| {arm} − {table['baseline']} ({len(p['seeds'])} seeds) | " +
                             " | ".join(_ci(p[split][k]) + f" {_short(p[split][k]['verdict'])}"
                                        for k in ks) + " |")
        for arm, p in table.get("vs_sft", {}).items():
            if split in p:
                lines.append(f"| {arm} − {w.start} | " +
                             " | ".join(_ci(p[split][k]) for k in ks) + " |")
    nc = table["null_control"]
    lines.append("")
    if not nc["ran"]:
        lines.append("Null control: **not run** -- the comparison is not a result.")
    else:
        bad = [k for k, ok in nc["within_floor"].items() if not ok]
        if nc["passes"]:
            verdict = (f"within the noise floor of {w.start} at every k -- the comparison "
                       "stands.")
        elif "gate" in table:  # the long-horizon analysis: the gate decides, this informs
            verdict = (f"**outside the noise floor of {w.start} at k = {', '.join(bad)}** (a "
                       "diagnostic here): updates on shuffled rewards alone move the policy "
                       f"that far, so an arm's change from the {w.start_long} is not by itself "
                       "learning; learning is read against the null (the gate below) and "
                       "method differences against the A/A control.")
        else:
            verdict = (f"**outside the noise floor of {w.start} at k = {', '.join(bad)}**: "
                       "optimiser "
                       "noise alone moves the policy that far, so the comparison is *not* "
                       "reported as a result.")
        lines.append("Null control (uniform, rewards shuffled within each batch): " + verdict)
    lines += ["", "**What the allocator did** (mean over steps, then mean ± std over seeds):",
              "", "| method | κ_min believed | κ_min realised | κ_min realised (p > 0) | "
              "κ_mean believed | κ_mean realised | mixed groups | budget on never-solved "
              f"{w.prompts} | training reward |", "|---|---|---|---|---|---|---|---|---|"]
    for method, e in table["methods"].items():
        def f(field: str, e: dict = e) -> str:
            v = e.get(field)
            return "–" if v is None else f"{v['mean']:.2f} ± {v['std']:.2f}"

        lines.append(f"| {method} | {f('kappa_believed_min')} | {f('kappa_true_min')} | "
                     f"{f('kappa_true_min_solvable')} | "
                     f"{f('kappa_believed_mean')} | {f('kappa_true_mean')} | "
                     f"{f('mixed_fraction')} | {f('never_solved_share')} | "
                     f"{f('reward_mean_last')} |")
    lines += answers_markdown(table)
    lines += ["", f"CIs: {table['ci_method']}. A difference is a win or a loss only when its "
              "CI excludes 0 and it exceeds the noise floor; otherwise it is inconclusive (=): "
              "not shown to differ, and not shown equal either."]
    if "curves" in table:
        lines += ["", *curves_markdown(table)]
    return "\n".join(lines) + "\n"


def exploratory_banner() -> str:
    """The first line of every table of an exploratory run."""
    return (f"**{EXPLORATORY[0].upper()}{EXPLORATORY[1:]}**: no committed pre-registration; "
            "read these numbers as an exploration, not as a pre-registered result.")


def _band(e: dict[str, Any]) -> str:
    if e.get("lo") is None:
        return f"{100 * e['mean']:+.1f} (1 seed)"
    return f"{100 * e['mean']:+.1f} [{100 * e['lo']:+.1f}, {100 * e['hi']:+.1f}]"


def _registered_gate(table: dict[str, Any]) -> str:
    """The gate on the registered null seeds, first, when an amendment added seeds (the
    table's gate is then a labelled extension); '' otherwise."""
    reg = table.get("gate_registered")
    if reg is None:
        return ""
    return (f" Registered seeds first: with the null seeds registered before any amendment "
            f"({', '.join(map(str, reg['null_seeds']))}) the gate reads {reg['outcome']}; "
            f"the line above adds null seeds {', '.join(map(str, reg['added_null_seeds']))} "
            "(a labelled extension).")


def curves_markdown(table: dict[str, Any]) -> list[str]:
    """The curve analysis: primary endpoint, gate, A/A, Δ(t) tables, Holm secondaries."""
    cur, prim, gate, aa = table["curves"], table["primary"], table["gate"], table["aa"]
    w = words(table.get("study"))
    ks = cur["ks"]
    est = prim["estimate"]
    p_text = "–" if est is None or est["p"] is None else f"{est['p']:.3g}"
    out = ["## Over the training curve", "", f"Bands: {cur['band_method']}.", "",
           f"**Primary endpoint** (fixed in the config before the run"
           f"{_prereg_note(table)}): "
           f"{prim['comparison']} on {SPLIT_NAMES[prim['split']]} "
           f"pass@{prim['k']}, mean of the last {prim['window_used']} points: " +
           ("not run" if est is None else f"{_band(est)} pp, p = {p_text}") +
           f" -- **{prim['outcome']}**." + _two_level(prim.get("two_level"), w.prompts) +
           verdict_sentence(prim) + _prereg_sentence(table), "", validity_sentence(table), "",
           f"**Gate** (uniform − null at held-out pass@1 over the same window, CI above 0 and "
           f"> {table['gate'].get('floor_multiple', 2):g} × noise floor): {gate['outcome']}."
           + _registered_gate(table),
           "", "**A/A control** (the baseline twice, different RL seeds, same evaluation "
           "keys): " + ("not run" if not aa["ran"] or aa["false_positive_rate"] is None else
                        f"{aa['false_positives']} of {aa['cells']} (point, k, split) cells "
                        f"exclude 0: false-positive rate {100 * aa['false_positive_rate']:.1f} %"
                        " (nominal 5 %)") + "."]
    for split in SPLITS:
        rows = [(name, d[split]) for name, d in cur["differences"].items()
                if split in d and not name.endswith("SFT")]
        if not rows:
            continue
        out += ["", f"Δ(t) on {SPLIT_NAMES[split]} {w.prompts} at the "
                f"last point (pp, mean [95 % band over seeds]):", "",
                "| comparison | seeds | " + " | ".join(f"pass@{k}" for k in ks) + " |",
                "|" + "---|" * (len(ks) + 2)]
        for name, d in rows:
            out.append(f"| {name} | {d['points']['1'][-1]['seeds']} | " + " | ".join(
                _band(d["points"][str(k)][-1]) for k in ks) + " |")
    out += ["", "Held-out pass@k at the last point, unbiased / with-replacement bootstrap (the "
            f"{w.published}'s estimator, biased low; for comparison with published "
            "figures only), percent, mean over seeds:", "",
            "| policy | " + " | ".join(f"pass@{k}" for k in ks) + " |",
            "|" + "---|" * (len(ks) + 1)]
    out.append(blind_row(table, [str(k) for k in ks], "| blind (exact) | ", " |"))
    rows = [(w.start, [cur["sft"]["eval"]])] + [
        (arm, [v["eval"] for v in runs.values()]) for arm, runs in cur["per_seed"].items()]
    for name, runs in rows:
        if runs:
            out.append(f"| {name} | " + " | ".join(
                f"{100 * np.mean([r['pass_at_k'][str(k)][-1] for r in runs]):.1f} / "
                f"{100 * np.mean([r['bootstrap_pass_at_k'][str(k)][-1] for r in runs]):.1f}"
                for k in ks) + " |")
    sec = cur["secondary"]
    hits = [k for k, e in sec["endpoints"].items() if e["significant"]]
    out += ["", f"Secondary endpoints: {sec['correction']}; significant after Holm: "
            f"{', '.join(hits) if hits else 'none'}."]
    return out


def verdict_sentence(prim: dict[str, Any]) -> str:
    """The primary endpoint's verdict in words (`compare.judge`: margin, TOST, MDE); '' for
    a table written before verdicts."""
    if "verdict" not in prim:
        return ""
    v, t, m = prim["verdict"], prim.get("tost"), prim.get("margin")
    mde = ("" if prim.get("mde") is None else
           f"MDE {100 * prim['mde']:.1f} pp at {100 * prim.get('power', 0.8):.0f} % power")
    est, floor = prim["estimate"], prim.get("floor")
    in_floor = (est.get("lo") is not None and (est["lo"] > 0 or est["hi"] < 0)
                and v == "inconclusive")
    why = (f"the CI is clear of 0 but the mean lies within the noise floor "
           f"(±{100 * floor:.1f} pp)" if in_floor and floor is not None else "")
    if t is None:
        text = f"no equivalence margin registered; **{v}**" + (
            f" ({why}; {mde})" if why and mde else f" ({why or mde})" if why or mde else "")
        return f" Verdict: {text}."
    ci = ("no interval (fewer than 2 seeds)" if t["lo"] is None else
          f"{100 * t['level']:.0f} % CI [{100 * t['lo']:+.1f}, {100 * t['hi']:+.1f}] pp")
    if v.startswith("equivalent"):
        text = f"**equivalent within ±{100 * m:.1f} pp** ({ci} inside the margin)"
    elif v in ("better", "worse"):
        text = (f"**{v}** ({ci} {'inside' if t['equivalent'] else 'not inside'} the "
                f"±{100 * m:.1f} pp margin)")
    else:
        wide = t["lo"] is not None and t["hi"] - t["lo"] > 2 * m
        reason = why or ("no interval" if t["lo"] is None else "CI wider than the margin"
                         if wide else "CI not inside the margin")
        text = f"**inconclusive**: {reason} ({ci}; margin ±{100 * m:.1f} pp)" + (
            f"; {mde}" if mde else "")
    return f" Verdict: {text}."


def blind_row(table: dict[str, Any], ks: list[str], head: str, tail: str) -> str:
    """The blind control's row (percent at each k; '–' where not computed)."""
    blind = table.get("blind", {}).get("pass_at_k", {})
    return head + " | ".join(_pct(blind.get(k)) for k in ks) + tail


def validity_sentence(table: dict[str, Any]) -> str:
    """The validity gate's verdict (and the override when it was used) for the tables."""
    v = table.get("validity")
    if v is None:
        return "Task validity: not measured (the start stage predates the blind control)."
    text = f"**Task validity**: {v['line']}."
    if v.get("test"):  # the sealed test split's blind control, beside the held-out one
        gate = " (the gate's split)" if v.get("gate_split") == "test" else ""
        text += f" Sealed test split{gate}: {v['test']['line']}."
    if v.get("override"):
        w = words(table.get("study"))
        text += (" **Override** (compare.allow_blind_task=True): the comparison ran on a start "
                 f"a {w.blind} guesser matches -- an exploration, not a result about reading "
                 f"{w.prompts}.")
    return text


def _prereg_note(table: dict[str, Any]) -> str:
    if table.get("exploratory"):
        return f"; {EXPLORATORY}"
    return "" if table["primary"]["preregistered"] else "; NOT pre-registered in this workdir"


def prereg_lines(p: dict[str, Any] | None) -> list[str]:
    """The pre-registration under a frontier or matched table: where it is, and "not
    committed in git" whenever git does not hold it as committed."""
    if not p:
        return []
    if p.get("exploratory"):
        return [f"**{EXPLORATORY}**."]
    return [f"Pre-registered in {p['path']}"
            f"{'' if p.get('committed') else ' (**not committed in git**)'}."]


def _two_level(e: dict[str, Any] | None, prompts: str) -> str:
    if not e:
        return ""
    return (f" Two-level bootstrap (seeds and held-out {prompts}): {100 * e['mean']:+.1f} "
            f"[{100 * e['lo']:+.1f}, {100 * e['hi']:+.1f}] pp.")


def _prereg_sentence(table: dict[str, Any]) -> str:
    p = table.get("preregistration")
    if not p:
        return ""
    if p.get("exploratory"):
        return f" **{EXPLORATORY}**."
    if not p.get("found"):
        return f" Committed pre-registration: **none** ({p['path']})."
    amended = "".join(
        f" Amended {a['written']} ({a['reason']}): " + "; ".join(
            f"{path} {old} -> {new}" for path, (old, new) in a["changed"].items()) + "."
        for a in p.get("amendments", []))
    return (f" Committed pre-registration {p['path']}: primary matches"
            f"{'' if p.get('hash_matches') else '; config hash DIFFERS'}"
            f"{'' if p.get('committed') else '; file not committed in git'}.{amended}")


def _ci(e: dict[str, float]) -> str:
    return f"{100 * e['mean']:+.1f} [{100 * e['lo']:+.1f}, {100 * e['hi']:+.1f}]"


def _short(verdict: str) -> str:
    return {"better": "▲", "worse": "▼"}.get(verdict, "=")
