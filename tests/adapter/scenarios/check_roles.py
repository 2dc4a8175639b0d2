"""Checks a dump's memory.framework.roles and event.phase against the truth job_roles.py wrote.

  python3 check_roles.py DUMPDIR TRUTH.json [--no-roles] [--incomplete] [--site LABEL] [--evidence]

Every role's bytes equal the truth to the byte (a role the truth does not name: 0); activations
are allocated minus the other roles (and the truth's, when it has one); the named holders are
exactly the truth's, with its bytes; phase, and the file/function/line of phase_frame, are the
truth's, and so is phase_site, the program's own line at or outside phase_frame.  --site LABEL: that holder names the line that created its tensors (truth losses_line).
--incomplete: the scan stopped at its budget: complete false, activations null, why given.
--no-roles: memory.framework.roles is null (the phase is still checked).
--evidence: the holders' purposes and copies, roles.models (the Net, once) and roles.statement are there.
--restored: every holder's bytes are what torch.load restored onto the GPU, from the truth's restored_line (without
it: none restored, where the dump says)."""
import glob
import json
import sys

ROLES = ("parameters", "buffers", "gradients", "per_sample_gradients", "optimizer_state", "graph_pools", "held_by_python",
         "activations")


def main():
    ddir, tfile = sys.argv[1], sys.argv[2]
    opts = sys.argv[3:]
    truth = json.load(open(tfile))["truth"]
    dumps = sorted(glob.glob(ddir + "/oomguard-*.json"))
    assert len(dumps) == 1, dumps
    d = json.load(open(dumps[0]))
    fw = d["memory"]["framework"]
    assert fw is not None, "no memory.framework"
    e = d["event"]
    assert e["phase"] == truth["phase"], (e["phase"], truth["phase"], e["phase_source"])
    if truth["phase"] is None:
        assert e["phase_frame"] is None, e["phase_frame"]
    else:
        check_phase_frames(e, truth)
    roles(fw, truth, opts)


def check_phase_frames(e, truth):
    pf = e["phase_frame"]
    assert pf is not None and pf["file"].endswith(truth["phase_file"]), (pf, truth["phase_file"])
    assert pf["function"] == truth["phase_function"], (pf, truth["phase_function"])
    if truth["phase_line"] is not None:
        assert pf["line"] == truth["phase_line"], (pf, truth["phase_line"])
    # the program's own line at or outside it: never the framework's (the stand-in torch counts as torch)
    ps = e["phase_site"]
    assert ps is not None and ps["file"].endswith("/job_roles.py"), (ps, pf)
    assert (ps["line"], ps["function"]) == (truth["site_line"], truth["site_function"]), (ps, truth)


def roles(fw, truth, opts):
    r = fw["roles"]
    if "--no-roles" in opts:
        assert r is None, r
        return
    assert r is not None, "no memory.framework.roles"
    assert r["allocated_bytes"] == fw["allocated_bytes"], (r["allocated_bytes"], fw["allocated_bytes"])
    if "--incomplete" in opts:
        assert r["complete"] is False and r["activations_bytes"] is None and r["why"], r
        return
    assert r["complete"] is True, r
    for role in ROLES[:-1]:
        want = truth["roles"].get(role, 0)
        assert r[role + "_bytes"] == want, (role, r[role + "_bytes"], want)
    others = sum(r[k + "_bytes"] for k in ROLES[:-1])
    assert r["activations_bytes"] == max(0, fw["allocated_bytes"] - others), r
    if "activations" in truth:
        assert r["activations_bytes"] == truth["activations"], (r["activations_bytes"], truth["activations"])
    assert sum(o["bytes"] for o in r["optimizers"]) == r["optimizer_state_bytes"], r["optimizers"]
    got = dict((h["label"], h["bytes"]) for h in r["holders"])
    assert got == truth["holders"], (got, truth["holders"])
    if "--evidence" in opts:
        # what the names say (self.cache: a cache; losses: nothing), no copies, the one model, the statement
        says = dict((h["label"], (h["purpose"], h["copy_of"])) for h in r["holders"])
        assert says == {"losses (list, global in job_roles.py)": (None, None),
                        "self.cache (dict on Trainer)": ("cache", None)}, says
        net = sum(truth["roles"].get(k, 0) for k in ("parameters",))
        # held by the global `model`, running (the failure is in its forward); AdamW trains it and has stepped;
        # all of it on the device, in training mode, in float32 (nothing of 8 bits or fewer)
        assert r["models"] == [{"class": "Net", "parameters_bytes": net, "tensors": 2, "count": 1,
                                "frozen": False, "named": 1, "running": 1, "names": ["model"],
                                "purpose": None, "trained": 1, "stepped": 1, "parameters_elsewhere_bytes": 0,
                                "training": 1, "parameters_float32_bytes": net,
                                "parameters_quantized_bytes": 0}], \
            (r["models"], net)
        assert r["operation"] is None and r["ddp"] is None, (r["operation"], r["ddp"])
        assert "statement" in r, r
        age = r["last_optimizer_step_ms_ago"]       # AdamW stepped once before the failing forward
        assert isinstance(age, (int, float)) and 0 <= age < 60000, age
        # what the framework had allocated right after that step, and the steps made
        assert r["allocated_after_steps"] == truth["after_steps"], (r["allocated_after_steps"], truth["after_steps"])
        assert r["optimizer_steps"] == 1, r["optimizer_steps"]
        assert r["optimizer_steps_on_device"] == 1, r["optimizer_steps_on_device"]
        assert r["allocated_over_run"] == {"every": 1, "bytes": truth["after_steps"]}, r["allocated_over_run"]
    if "--placement" in opts:
        # the statement reads `replica`, whose parameters are on cuda:1, and fails on cuda:0
        assert r["statement_model_device"] == 1 and r["statement_model"] == "replica", \
            (r["statement_model_device"], r["statement_model"])
    else:
        assert r["statement_model_device"] is None and r["statement_model"] is None, \
            (r["statement_model_device"], r["statement_model"])
    if "--restored" in opts:
        # every holder says what torch.load restored onto the GPU of it: all of the shards, from their line
        for h in r["holders"]:
            assert h["restored_bytes"] == h["bytes"], h
            assert h["restored_site"] is not None and h["restored_site"]["line"] == truth["restored_line"], h
    elif "restored_bytes" in (r["holders"] or [{}])[0]:
        assert all(h["restored_bytes"] == 0 and h["restored_site"] is None for h in r["holders"]), r["holders"]
    if "--steps" in opts:
        # the optimizer steps made on the failing device: 0 is measured (every step watched since torch's import)
        want = int(opts[opts.index("--steps") + 1])
        assert r["optimizer_steps"] == want and r["allocated_after_steps"] is None, \
            (r["optimizer_steps"], r["allocated_after_steps"])
        assert r["optimizer_steps_on_device"] == want, r["optimizer_steps_on_device"]
    if "--site" in opts:
        label = opts[opts.index("--site") + 1]
        h = [h for h in r["holders"] if h["label"] == label][0]
        assert h["site"] is not None and h["site"]["line"] == truth["losses_line"], (h, truth["losses_line"])
    print("roles and phase as the truth: %s" % json.dumps(dict((k, r[k + "_bytes"]) for k in ROLES)))


main()
