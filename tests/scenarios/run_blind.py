#!/usr/bin/env python3
"""Runs the blind scenarios (tests/scenarios/blind/NAME.json): users' programs whose expectations were
written before they ever ran under the library, by someone who had not read the diagnosis rules.
Each case runs like a corpus case (run_scenarios.run_case, checked by check.py: truth, texts and
the expectation), and is then scored on three questions, per set (dev / validation):
  primary right          the diagnosis' primary cause is among the acceptable ones
  first remedy acceptable the first remedy is one of `first` (when given) and none of the forbidden
  top-3 met              every top3_required entry is in the top 3 and no top3_forbidden one is
A validation case prints its name and PASS or FAIL only (and, with --repeat, whether its answer varied): what it
got or missed is not shown, so no rule is tuned to it by reading its run.
Not part of `make test`: these measure the rules, they are expected to fail where the catalog or
the rules fall short.  Exits 0 whatever the scores (it is a measurement).

With --attainable, each case's dump is also edited to say what the expert said (the primary, the
first remedy, the required top 3, none of the forbidden ones; every number left as measured) and
check.py must accept the edited copy: the expectation can be met by a dump of this very run.

With --trace, a failing dev case also prints how the ranking placed its first remedies and the expected
ones (remedies[].ranking: tier, order, estimate and the rows that touched each): which rows to read when
working on the rules.  Never for a validation case: no rule is tuned to those, so their dumps stay unread.

usage: run_blind.py [--attainable] [--trace] [--set dev|validation] [--repeat N] [NAME ...]    environment: as run_scenarios.py (B, PRELOAD, SCEN_KEEP)"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import check
import run_scenarios

BLIND = os.path.join(run_scenarios.HERE, "blind")


# Remedy ids two writers, each blind to the catalog and to the other, gave one fix.  A writer names a
# new id where the catalog lacks the fix; when another case's id for the same fix became the catalog's
# row first, the later name is read as that row (the case file stays as written).  Only ids the
# catalog does not have can be read this way: a name the catalog uses for something else is never
# redirected (fraction_cap's raise_limit stays raise_limit).
SAME_FIX = {
    # nvjpeg_decode_in_spawned_loader_workers (seventh batch); kornia_gpu_augment_in_spawned_workers
    # (sixth) named the same fix, CUDA kept out of the DataLoader workers, cuda_out_of_workers
    "gpu_work_in_main_process": "cuda_out_of_workers",
    # qwen7b_calibration_generate_scores_and_logits (eighth batch) and invoice_extraction_generate_output_scores
    # (seventh) named the fix of e5_mistral_embed_output_hidden_states_all_layers (eighth), only_needed_outputs:
    # ask the model only for the outputs the job uses (no per-step scores, logits or hidden states kept)
    "drop_per_step_outputs": "only_needed_outputs",
    "drop_output_scores": "only_needed_outputs",
    # deepspeed_zero3_from_pretrained_before_init (seventh batch) and fsdp_qlora_70b_full_load_per_rank (sixth)
    # named the fix of fsdp_lora_llama2_13b_g5_12xlarge_device_map_local_rank (eighth), shard_before_load
    "shard_at_load": "shard_before_load",
    # fastai_tabular_learner_criteo_2m_rows_26_categoricals_first_backward_kaggle_p100 (twenty-fifth batch) named the
    # fix deepfm_ad_clicks_hashed_cross_features_dense_embedding_grads_first_backward_a10g (an earlier batch) calls
    # smaller_embedding_tables: fewer dimensions for wide categorical columns, rare categories hashed together
    "cap_categorical_embeddings": "smaller_embedding_tables",
    # qwen25_7b_yarn_64k_packed_lora_sft_fp32_upcast_full_vocab_logits_h100 (thirty-ninth batch) named the fix of
    # gemma_lora_fp32_logits_ce (an earlier batch), fused_cross_entropy: a chunked or fused loss that never makes the
    # [tokens, vocabulary] logits whole
    "chunked_cross_entropy": "fused_cross_entropy",
    # gat_ogbn_products_full_batch_training_edge_messages_a100_40gb (thirty-ninth batch) named the fix of
    # pinsage_hub_item_full_fanout_subgraph_rtx4090 (an earlier batch), cap_input_size: a graph's input capped to a
    # batch's sampled subgraph (neighbour sampling, a capped fan-out)
    "neighbor_sampling": "cap_input_size",
}


def catalog_ids():
    import re
    src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis", "remedies.def")).read()
    return set(re.findall(r'^X\(\w+, "(\w+)"', src, re.M))


def as_catalog(exp, known=None):
    """The expectation with SAME_FIX's names read as the catalog's ids (a copy; the file is untouched)."""
    known = catalog_ids() if known is None else known
    for alias, row in SAME_FIX.items():
        assert alias not in known and row in known, (alias, row)

    def tr(v):
        if isinstance(v, str):
            return SAME_FIX.get(v, v)
        if isinstance(v, list):
            return [tr(x) for x in v]
        return v
    return {k: (tr(v) if k in ("first", "top3_required", "first_forbidden", "top3_forbidden",
                               "remedies_forbidden", "before") else v) for k, v in exp.items()}


def final_dump(dumps, exp):
    """The dump the case is about: the last one of the expected status (as check.py selects them)."""
    want = exp.get("status", "oom")
    found = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(dumps, "oomguard-*.json")))]
    found = [d for d in found if d.get("status") == want]
    return found[-1] if found else None


def score(d, exp):
    """(primary right, first remedy acceptable, top-3 met) for one dump; None where the case does not say."""
    if d is None:
        return False, False, False
    primary = d["diagnosis"].get("primary")
    ids = [r["id"] for r in check.shown_first(d)]
    top3 = ids[:3]
    p_ok = primary in check.alts(exp["primary"]) if "primary" in exp else None
    first = ids[0] if ids else None
    f_ok = first is not None
    if "first" in exp:
        f_ok = f_ok and first in check.alts(exp["first"])
    bad_first = set(exp.get("first_forbidden", [])) | set(exp.get("top3_forbidden", [])) | set(
        exp.get("remedies_forbidden", []))
    if not check.inference_mode_may_lead(exp):
        bad_first.add("inference_mode")
    f_ok = f_ok and first not in bad_first
    t_ok = all(any(a in top3 for a in check.alts(e)) for e in exp.get("top3_required", [])) and not any(
        e in top3 for e in exp.get("top3_forbidden", []))
    return p_ok, f_ok, t_ok


def ranking_trace(d, exp):
    """Lines: the first five remedies and each expected one (first, top3_required) with how the ranking
    placed it (the dump's remedies[].ranking); an expected id the ranking did not list says so."""
    rems = d["remedies"] if d else []
    by_id = {r["id"]: r for r in rems}

    def line(r):
        k = r.get("ranking", {})
        est = k.get("estimate_bytes")
        est = "%.2f GB" % (est / 1e9) if est is not None else k.get("estimate", "?")
        return "%2d %-26s tier %s order %5s est %-10s rows %s" % (r["rank"], r["id"], k.get("tier", "?"),
                                                               k.get("order", "?"), est, ",".join(k.get("rows", [])))
    out = [line(r) for r in rems[:5]]
    wanted = list(check.alts(exp["first"])) if "first" in exp else []
    for e in exp.get("top3_required", []):
        wanted += [a for a in check.alts(e) if a not in wanted]
    for w in wanted:
        r = by_id.get(w)
        if r is None:
            out.append("   %-26s not listed" % w)
        elif r["rank"] > 5:
            out.append(line(r))
    return out


def expert_edit(d, exp):
    """The dump d, edited to say what the expectation says (ids only; numbers untouched)."""
    d = json.loads(json.dumps(d))
    diag = d["diagnosis"]
    if "primary" in exp and diag.get("primary") not in check.alts(exp["primary"]):
        want = check.alts(exp["primary"])[0]
        old = next((c for c in diag.get("causes", []) if c["id"] == diag.get("primary")), None)
        diag["causes"] = [c for c in diag.get("causes", []) if c["id"] != want]
        if old is not None:
            old["id"] = want
        diag["primary"] = want
    bad = set(exp.get("first_forbidden", [])) | set(exp.get("top3_forbidden", [])) | set(
        exp.get("remedies_forbidden", []))
    rx = exp.get("top3_text_forbidden", [])
    keep = [r for r in d["remedies"] if r["id"] not in bad
            and not any(__import__("re").search(x, check.remedy_text(r)) for x in rx)]
    wanted = ([check.alts(exp["first"])[0]] if "first" in exp else []) + [
        check.alts(e)[0] for e in exp.get("top3_required", []) if not any(a in [r["id"] for r in keep[:3]]
                                                                          for a in check.alts(e))]
    lead = []
    for w in wanted:
        if w in [r["id"] for r in lead]:
            continue
        r = next((r for r in keep if r["id"] == w), None)
        lead.append(r if r is not None else {"id": w, "title": w.replace("_", " "), "why": "the expert's fix",
                                               "how": "the expert's fix"})
    d["remedies"] = lead + [r for r in keep if r["id"] not in wanted]
    for i, r in enumerate(d["remedies"]):
        r["rank"] = i + 1
        r["shown"] = i < 5
    return d


def attainable(name, work, exp, cases_dir=BLIND):
    """check.py accepts this run's dumps edited to the expert's answer: every dump of the expected
    status is edited (a multi-rank case checks each rank's), the others are copied as they are."""
    if final_dump(os.path.join(work, "dumps"), exp) is None:
        return False, "no dump to edit"
    edir = os.path.join(work, "edited")
    shutil.rmtree(edir, ignore_errors=True)
    os.makedirs(edir)
    for src in sorted(glob.glob(os.path.join(work, "dumps", "oomguard-*.json"))):
        base, d = os.path.basename(src), json.load(open(src))
        if d.get("status") == exp.get("status", "oom"):
            d = expert_edit(d, exp)
        json.dump(d, open(os.path.join(edir, base), "w"))
        if os.path.exists(src[:-5] + ".txt"):
            shutil.copy(src[:-5] + ".txt", os.path.join(edir, base[:-5] + ".txt"))
    chk = subprocess.run([sys.executable, os.path.join(run_scenarios.HERE, "check.py"), os.path.join(cases_dir, name + ".json"),
                          "preload", edir, os.path.join(work, "truth")], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, universal_newlines=True)
    return chk.returncode == 0, "; ".join(l for l in chk.stdout.splitlines() if l.startswith("FAIL"))[:400]


def main():
    ap = argparse.ArgumentParser(description="Scores the diagnosis on the blind scenarios.")
    ap.add_argument("--attainable", action="store_true", help="also check the expert's answer is attainable")
    ap.add_argument("--set", choices=("dev", "validation"), dest="only_set",
                    help="only this set (a rule writer runs --set dev and never sees a validation case)")
    ap.add_argument("--trace", action="store_true",
                    help="a failing dev case prints how the ranking placed its remedies (never a validation case)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run each case N times; the scores are the first run's, and a case whose primary or "
                    "top 3 differs between runs is named (a rule that depends on timing)")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    names = a.names or sorted(os.path.basename(f)[:-5] for f in glob.glob(os.path.join(BLIND, "*.json")))
    if a.only_set:
        names = [n for n in names if json.load(open(os.path.join(BLIND, n + ".json"))).get("set", "dev") == a.only_set]
    keep = os.environ.get("SCEN_KEEP")
    tmp = keep or tempfile.mkdtemp(prefix="oomguard-blind.")
    sets = {}
    varies = []
    for name in names:
        case = json.load(open(os.path.join(BLIND, name + ".json")))
        exp = as_catalog(case.get("expect", {}))
        cases_dir = BLIND
        if exp != case.get("expect", {}):
            # check.py reads the case from a file: the catalog's reading of it, beside the runs
            case["expect"] = exp
            cases_dir = os.path.join(tmp, "as-catalog")
            os.makedirs(cases_dir, exist_ok=True)
            json.dump(case, open(os.path.join(cases_dir, name + ".json"), "w"), indent=1)
        answers = []
        for rep in range(max(1, a.repeat)):
            work = os.path.join(tmp, name if rep == 0 else "%s.run%d" % (name, rep + 1))
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            ok, detail, got = run_scenarios.run_case(name, case, "preload", work, cases_dir=cases_dir)
            d = final_dump(os.path.join(work, "dumps"), exp)
            answers.append(None if d is None else (d["diagnosis"].get("primary"), [r["id"] for r in check.shown_first(d)][:3]))
            if rep:
                continue
            p_ok, f_ok, t_ok = score(d, exp)
            s = case.get("set", "dev")
            row = sets.setdefault(s, {"n": 0, "pass": 0, "primary": [0, 0], "first": [0, 0], "top3": [0, 0]})
            row["n"] += 1
            row["pass"] += ok
            for k, v in (("primary", p_ok), ("first", f_ok), ("top3", t_ok)):
                if v is not None:
                    row[k][0] += bool(v)
                    row[k][1] += 1
            if s == "dev":
                print("%s %s [%s] %s" % ("PASS" if ok else "FAIL", name, s, got or "no dump"))
                for line in detail:
                    if line.startswith("FAIL"):
                        print("    " + line)
            else:  # a validation case says only whether it passed: what it got, or missed, is not for tuning
                print("%s %s [%s]" % ("PASS" if ok else "FAIL", name, s))
            if a.trace and not ok and s == "dev":
                for line in ranking_trace(d, exp):
                    print("      " + line)
            if a.attainable:
                a_ok, why = attainable(name, work, exp, cases_dir)
                row["attain"] = row.get("attain", 0) + a_ok
                print("    attainable: %s%s" % ("yes" if a_ok else "NO", "" if a_ok or s != "dev" else " (" + why + ")"))
        if any(x != answers[0] for x in answers[1:]):
            varies.append(name)
            if case.get("set", "dev") == "dev":
                print("    VARIES over %d runs: %s" % (len(answers), "; ".join(
                    "no dump" if x is None else "%s %s" % (x[0], "/".join(x[1])) for x in answers)))
            else:
                print("    VARIES over %d runs" % len(answers))
    print()
    parts = []
    for s in sorted(sets, key=lambda x: (x != "dev", x)):
        r = sets[s]
        parts.append("%s: %d/%d primary right, %d/%d first remedy acceptable, %d/%d top-3 met (%d/%d cases pass)"
                     % (s, r["primary"][0], r["primary"][1], r["first"][0], r["first"][1], r["top3"][0], r["top3"][1],
                        r["pass"], r["n"]) + ("; %d/%d attainable" % (r.get("attain", 0), r["n"])
                                              if a.attainable else ""))
    print("; ".join(parts))
    if a.repeat > 1:
        print("same answer in all %d runs: %d/%d cases%s" % (a.repeat, len(names) - len(varies), len(names),
                                                          (" (varies: %s)" % ", ".join(varies)) if varies else ""))
    if not keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
