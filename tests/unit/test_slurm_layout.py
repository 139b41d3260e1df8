"""Pure Slurm parts: node list expansion, allocation from SLURM_* variables, role layout, GPU masks."""
from __future__ import annotations

import pytest
import yaml

from cluster.inventory import load_inventory
from cluster.slurm_layout import (Allocation, SlurmLayout, SlurmLayoutError, allocation_from_env, expand_counts,
                           expand_nodelist, layout_inventory, parse_gpu_ids, parse_job_gpus)

SCONTROL_JOB = """JobId=7 JobName=x
   NodeList=n[1-2]
   NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   JOB_GRES=gpu:3
     Nodes=n1 CPU_IDs=3 Mem=0 GRES=gpu:2(IDX:0-1)
     Nodes=n2 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3)
"""


@pytest.mark.parametrize("text, names", [
    ("node[01-03,07],gpu-a[1-2]", ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]),
    ("n1", ["n1"]),
    ("a,b,c", ["a", "b", "c"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("r[1-2]c[1-2]", ["r1c1", "r1c2", "r2c1", "r2c2"]),
    ("node[098-101]", ["node098", "node099", "node100", "node101"]),
])
def test_expand_nodelist_as_slurm_does(text, names):
    assert expand_nodelist(text) == names


@pytest.mark.parametrize("text", ["n[1-", "n[a-b]", "n[3-1]", "n]1["])
def test_bad_nodelist_is_a_clear_error(text):
    with pytest.raises(SlurmLayoutError, match="node list"):
        expand_nodelist(text)


def test_counts_and_gpu_ids():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert parse_gpu_ids("0,1") == ("0", "1")
    assert parse_gpu_ids("gpu:2(IDX:0-1)") == ("0", "1")
    assert parse_gpu_ids("") == ()
    assert parse_job_gpus(SCONTROL_JOB) == {"n1": ("0", "1"), "n2": ("3",)}


def test_allocation_from_env_prefers_job_nodelist_and_hostnames():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n2", "SLURM_NODELIST": "n[1-2]",
           "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_GPUS": "0,1"}
    alloc = allocation_from_env(env)
    assert alloc == Allocation("7", ("n1", "n2"), (2, 2), (("0", "1"), ("0", "1")))
    alloc = allocation_from_env(env, hostnames=["x1", "x2"], node_gpus={"x1": ("3",)})
    assert alloc.nodes == ("x1", "x2") and alloc.gpus == (("3",), ())


def test_not_in_an_allocation():
    with pytest.raises(SlurmLayoutError, match="SLURM_JOB_ID") as info:
        allocation_from_env({})
    assert info.value.exit_code == 2 and "salloc" in info.value.hint


def _load(tmp_path, document):
    path = tmp_path / "slurm.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_inventory(str(path))


def test_default_layout_one_ps_per_node_and_chief_first(tmp_path):
    alloc = Allocation("7", ("n1", "n2", "n3"), (2, 2, 2), ((), (), ()))
    inv = _load(tmp_path, layout_inventory(alloc, SlurmLayout(), python="/py", workdir="/w", mode="async"))
    assert inv.hosts_of("chief") == ("n1",)
    assert inv.hosts_of("ps") == ("n1", "n2", "n3")
    assert inv.hosts_of("worker") == ("n1", "n2", "n3")
    assert inv.host("n2").slots_for("worker").count == 2
    assert inv.host("n2").connection == "slurm"
    assert inv.mode == "async" and inv.hosts_of("evaluator") == ()


def test_pscluster_transport_slurm_is_the_same_as_ansible_connection(tmp_path):
    from cluster.errors import InventoryError
    inv = _load(tmp_path, {"all": {"vars": {"pscluster_transport": "slurm"}, "children": {
        "worker": {"hosts": {"n1": {}, "n2": {"pscluster_transport": "local"}}}}}})
    assert inv.host("n1").connection == "slurm" and inv.host("n2").connection == "local"
    same = _load(tmp_path, {"all": {"hosts": {"n1": {"pscluster_transport": "slurm", "ansible_connection": "slurm"}},
                                    "children": {"worker": {"hosts": {"n1": {}}}}}})
    assert same.host("n1").connection == "slurm"
    with pytest.raises(InventoryError, match="pscluster_transport: slurm contradicts ansible_connection: ssh"):
        _load(tmp_path, {"all": {"hosts": {"n1": {"pscluster_transport": "slurm", "ansible_connection": "ssh"}},
                                 "children": {"worker": {"hosts": {"n1": {}}}}}})
    with pytest.raises(InventoryError, match="expected one of ssh, local, slurm"):
        _load(tmp_path, {"all": {"vars": {"pscluster_transport": "k8s"}, "children": {
            "worker": {"hosts": {"n1": {}}}}}})


def test_layout_options(tmp_path):
    alloc = Allocation("7", ("n1", "n2"), (1, 1), ((), ()))
    doc = layout_inventory(alloc, SlurmLayout(ps=3, chief=False, workers_per_node=3, evaluator=True),
                           python="/py", workdir="/w")
    inv = _load(tmp_path, doc)
    assert inv.hosts_of("chief") == () and inv.hosts_of("evaluator") == ("n2",)
    assert inv.host("n1").slots_for("ps").count == 2 and inv.host("n2").slots_for("ps").count == 1
    assert inv.host("n1").slots_for("worker").count == 3


def test_gpu_masks_are_the_granted_ids_not_physical_indices(tmp_path):
    alloc = Allocation("7", ("n1", "n2"), (2, 1), (("2", "3"), ("5",)))
    doc = layout_inventory(alloc, SlurmLayout(gpus_per_worker=1), python="/py", workdir="/w")
    inv = _load(tmp_path, doc)
    assert inv.host("n1").slots_for("worker").gpus == ("2", "3")
    assert inv.host("n2").slots_for("worker").gpus == ("5",)


def test_more_gpus_than_granted_fails_clearly():
    alloc = Allocation("7", ("n1", "n2"), (2, 2), (("0", "1"), ("0",)))
    with pytest.raises(SlurmLayoutError, match=r"node n2: 2 worker\(s\) x 1 GPU\(s\) need 2 GPUs.*granted 1") as info:
        layout_inventory(alloc, SlurmLayout(gpus_per_worker=1), python="/py", workdir="/w")
    assert "--gres" in info.value.hint


def test_preflight_counts_slurm_granted_gpus_only_without_nvidia_smi():
    import json
    from cluster.transport.slurm import _granted_gpus
    missing = json.dumps({"gpus": [], "gpu_error": "nvidia-smi not found", "cpus": 4})
    facts = json.loads(_granted_gpus(missing, "0,1"))
    assert facts["gpus"] == ["GPU 0: granted by Slurm", "GPU 1: granted by Slurm"] and facts["gpu_error"] is None
    assert json.loads(_granted_gpus(missing, "2"))["gpus"][2] == "GPU 2: granted by Slurm"
    real = json.dumps({"gpus": ["GPU 0: A100"], "gpu_error": None})
    assert _granted_gpus(real, "0,1") == real            # nvidia-smi's own answer stands


def test_slurm_transport_runs_steps_of_the_calling_job(monkeypatch):
    from cluster.errors import HostError
    from cluster.plan import HostSpec
    from cluster.transport import open_transport
    host = HostSpec("n2", "n2", "slurm", None, None, None, "/py", "/w", "reject", None, 10.0)
    transport = open_transport(host)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert transport._srun()[:6] == ["srun", "--jobid=42", "--nodelist=n2", "--nodes=1", "--ntasks=1", "--overlap"]
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    with pytest.raises(HostError, match="SLURM_JOB_ID is not set"):
        transport._srun()


def _script(tmp_path, **changes):
    import subprocess
    from cluster.slurm_layout import BatchJob, sbatch_script
    fields = dict(nodes=2, workers_per_node=1, mode="sync", job="distributed_mnist", python="/v/bin/python",
                  checkout="/src/pscluster", steps=100, time_limit="0:10:00", gres="gpu:2", name="demo")
    text = sbatch_script(BatchJob(**{**fields, **changes}))
    script = tmp_path / "job.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    return text, text.splitlines()


def test_sbatch_script_brings_up_trains_and_always_takes_down(tmp_path):
    text, lines = _script(tmp_path)
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --time=0:10:00\n#SBATCH --gres=gpu:2" in text
    assert "--partition" not in text
    up = lines.index('/v/bin/python -m cluster up --slurm "$inventory" --name demo --mode sync')
    trap = lines.index("trap finish EXIT")
    finish = lines.index("finish() {")
    assert finish < trap < up and lines[finish + 1] == "  /v/bin/python -m cluster down --name demo || true"
    train = next(line for line in lines if " -m cluster train " in line)
    assert lines.index(train) > up and train.endswith(" &")    # in the background: a signal reaches the trap at once
    assert train.startswith("/v/bin/python -m cluster train distributed_mnist --name demo --steps 100 ")


def test_sbatch_script_resumes_from_a_fixed_checkpoint_and_requeues_before_the_time_limit(tmp_path):
    text, lines = _script(tmp_path, warn_seconds=300, checkpoint_every=50)
    assert {"#SBATCH --signal=B:USR1@300", "#SBATCH --requeue", "#SBATCH --open-mode=append"} <= set(lines)
    assert 'checkpoints="${SLURM_SUBMIT_DIR:-$PWD}/pscluster-checkpoints/"demo/distributed_mnist' in lines
    train = next(line for line in lines if " -m cluster train " in line)
    assert ' --checkpoint-dir "$checkpoints" --checkpoint-every 50 --resume --stop-grace 30 &' in train
    # USR1 (the time-limit warning) and TERM pass SIGTERM on to train; only USR1 requeues, after down.
    assert "trap 'stop timelimit' USR1" in lines and "trap 'stop TERM' TERM" in lines
    finish = lines.index("finish() {")
    assert lines[finish + 2:finish + 5] == ['  if [ "$stopped" = timelimit ]; then',
                                           '    echo "pscluster: time limit near: training stopped, '
                                           'requeueing job $SLURM_JOB_ID" >&2',
                                           '    scontrol requeue "$SLURM_JOB_ID"']
    with pytest.raises(SlurmLayoutError, match="--warn-before 30 s leaves no time"):
        _script(tmp_path, warn_seconds=30)
    own = _script(tmp_path, checkpoint_dir="/shared/ck pt", requeue=False)[1]
    assert "checkpoints='/shared/ck pt'" in own and 'scontrol requeue "$SLURM_JOB_ID"' not in "\n".join(own)


def test_sbatch_script_passes_signals_on_and_requeues_itself(tmp_path):
    """Run the script's control flow with stand-ins for pscluster and scontrol: USR1 during
    training -> train gets SIGTERM, down runs, then the requeue; TERM -> no requeue."""
    import os
    import signal
    import subprocess
    import time
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.txt"
    fake = bin_dir / "python"
    fake.write_text(f"""#!/bin/bash
shift 2   # -m cluster
echo "$1" >> {log}
if [ "$1" = train ]; then trap 'echo train-got-TERM >> {log}; exit 143' TERM; touch {tmp_path}/training
  while :; do sleep 0.1; done; fi
""")
    (bin_dir / "scontrol").write_text(f"#!/bin/bash\necho scontrol $* >> {log}\n")
    for tool in (fake, bin_dir / "scontrol"):
        tool.chmod(0o755)
    for sig, requeued in ((signal.SIGUSR1, True), (signal.SIGTERM, False)):
        text, _ = _script(tmp_path, python=str(fake))
        log.write_text("")
        (tmp_path / "training").unlink(missing_ok=True)
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="7", SLURM_SUBMIT_DIR=str(tmp_path))
        proc = subprocess.Popen(["bash", str(tmp_path / "job.sh")], env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while not (tmp_path / "training").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
        calls = log.read_text().split("\n")
        assert calls[:4] == ["up", "train", "train-got-TERM", "down"], (calls, err)
        assert ("scontrol requeue 7" in calls) is requeued
        assert proc.returncode == 143


def test_export_carries_the_layout_and_can_run_a_program(tmp_path):
    import yaml
    from tests.unit.test_export import Captured
    inventory = tmp_path / "shape.yaml"
    inventory.write_text(yaml.safe_dump({"all": {"vars": {"pscluster_mode": "async"}, "children": {
        "worker": {"hosts": {"a": {"worker_tasks": 2, "worker_gpus": [[0], [1]]}, "b": {"worker_gpus": [[0]]}}},
        "ps": {"hosts": {"a": {"ps_tasks": 3}}}, "chief": {"hosts": {"a": {}}},
        "evaluator": {"hosts": {"b": {}}}}}}))
    out = tmp_path / "job.sh"
    done = Captured(tmp_path / "state")
    assert done.run("export", str(inventory), "--format", "sbatch", "--name", "lay", "-o", str(out)) == 0, \
        done.stderr.getvalue()
    lines = out.read_text().splitlines()
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --ntasks-per-node=2" in lines
    up = next(line for line in lines if " -m cluster up --slurm " in line)
    # the side-car evaluator runs in every mode: the layout asks for one (on the last node)
    assert up.endswith('--name lay --mode async --ps 3 --workers-per-node 2 --evaluator --gpus-per-worker 1'), up
    sync = Captured(tmp_path / "state")     # sync: no chief, no ps (MultiWorkerMirroredStrategy's roles)
    assert sync.run("export", str(inventory), "--format", "sbatch", "--mode", "sync", "-o", str(out)) == 0
    up = next(line for line in out.read_text().splitlines() if " -m cluster up --slurm " in line)
    assert up.endswith("--mode sync --ps 0 --no-chief --workers-per-node 2 --evaluator --gpus-per-worker 1"), up
    program = Captured(tmp_path / "state")
    assert program.run("export", str(inventory), "--format", "sbatch", "--name", "lay", "-o", str(out),
                       "--run", "python prog.py --index={task_index} 'two words'") == 0, program.stderr.getvalue()
    lines = out.read_text().splitlines()
    assert any(line.endswith(" -m cluster run --name lay -- python prog.py '--index={task_index}' 'two words' &")
               for line in lines), lines
    assert not any(" -m cluster train " in line for line in lines)
    bad = Captured(tmp_path / "state")
    assert bad.run("export", str(inventory), "--format", "sbatch", "--run", "python p.py {nope}") == 2
    assert "nope" in bad.stderr.getvalue() and "Traceback" not in bad.stderr.getvalue()


def test_a_step_that_never_answers_times_out_instead_of_hanging(tmp_path, monkeypatch):
    import time
    from cluster.errors import HostError
    from cluster.plan import HostSpec
    from cluster.transport.slurm import SlurmTransport
    fake = tmp_path / "srun"            # like srun waiting for a pending job: no output, ever
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    transport = SlurmTransport(HostSpec("n1", "n1", "slurm", None, None, None, "/py", "/w", "reject", None, 10.0))
    began = time.monotonic()
    with pytest.raises(HostError, match="timed out after 1 s"):
        transport.run(["true"], timeout=1.0)
    assert time.monotonic() - began < 5


def test_sbatch_script_asks_for_a_range_of_nodes_with_max_nodes(tmp_path):
    from cluster.slurm_layout import SlurmLayoutError
    text, _ = _script(tmp_path, max_nodes=3)
    assert "#SBATCH --nodes=2-3\n" in text
    assert "#SBATCH --nodes=2\n" in _script(tmp_path, max_nodes=2)[0]
    with pytest.raises(SlurmLayoutError, match="fewer than the inventory's 2"):
        _script(tmp_path, max_nodes=1)


@pytest.mark.parametrize("option, value", [
    ("time_limit", "1:00:00\nrm -rf ~"), ("time_limit", "1:00:00 --signal=B:KILL@1"), ("time_limit", "\x1b[2J"),
    ("partition", "gpu\n#SBATCH --no-requeue"), ("partition", "a b"), ("partition", "$(id)"),
    ("gres", "gpu:2\ntouch /tmp/x"), ("gres", "gpu:2;id"), ("gres", "gpu:`id`"), ("time_limit", "1:00:00\r"),
])
def test_sbatch_options_cannot_inject_lines(tmp_path, option, value):
    """N8 (issue 25): --time, --partition and --gres went raw into the script; a newline
    injected a shell line and sbatch then ignored the later --signal and --requeue."""
    from cluster.slurm_layout import SlurmLayoutError
    with pytest.raises(SlurmLayoutError, match="is not a Slurm"):
        _script(tmp_path, **{option: value})


@pytest.mark.parametrize("option, value", [("time_limit", "30"), ("time_limit", "2-12:00:00"), ("time_limit", "UNLIMITED"),
                                           ("partition", "short,long"), ("gres", "gpu:a100:1,mps:100")])
def test_sbatch_options_slurm_accepts_still_pass(tmp_path, option, value):
    text, _ = _script(tmp_path, **{option: value})
    assert f"={value}\n" in text


def test_sbatch_option_fuzz():
    """2,000 random values per option from an alphabet of Slurm's characters, shell syntax,
    whitespace and control characters: each is refused, or every directive stays one line in
    the #SBATCH block, which still ends with --signal, --requeue and --open-mode."""
    import random
    from cluster.slurm_layout import BatchJob, SlurmLayoutError, sbatch_script
    rng = random.Random(25)
    alphabet = "0123456789:-,._()=/abgpuUNLIMTED \t\n\r\x00\x1b\x7f\x85;$`'\"\\#|&<>*?[]{}~"
    refused = accepted = 0
    for index in range(6000):
        option = ("time_limit", "partition", "gres")[index % 3]
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        job = BatchJob(nodes=1, workers_per_node=1, mode="sync", python="/v/bin/python", checkout="/src",
                       **{option: value})
        try:
            text = sbatch_script(job)
        except SlurmLayoutError:
            refused += 1
            continue
        accepted += 1
        lines = text.split("\n")
        block = lines[1:lines.index("#SBATCH --open-mode=append") + 1]
        assert all(line.startswith("#SBATCH --") and " " not in line[8:] and line.isprintable() for line in block), value
        assert block[-3:] == [f"#SBATCH --signal=B:USR1@{job.warn_seconds}", "#SBATCH --requeue",
                              "#SBATCH --open-mode=append"]
    assert refused and accepted


@pytest.mark.parametrize("detail, end", [
    ("JobId=7 JobName=x JobState=RUNNING Reason=None Dependency=(null) NodeList=n[1-2]", None),
    ("JobId=7 JobState=SUSPENDED Reason=None", None),
    ("JobId=7 JobName=x JobState=NODE_FAIL Reason=NodeDown Dependency=(null)", "NODE_FAIL, reason NodeDown"),
    ("JobId=7 JobState=CANCELLED Reason=None", "CANCELLED"),
    ("JobId=7 JobState=TIMEOUT Reason=TimeLimit", "TIMEOUT, reason TimeLimit"),
    ("JobId=7 JobState=PENDING Reason=BeginTime", "PENDING, reason BeginTime"),      # requeued: the steps are gone
    ("no such text", None),                                                         # cannot tell: not ended
])
def test_how_a_slurm_job_ended_from_scontrol(detail, end):
    from cluster.transport.slurm import ENDED_HINTS, ended_error, job_end
    assert job_end(detail) == end
    if end is not None:
        error = ended_error("n2", "7", end)
        assert error.message.startswith(f"n2: Slurm job 7 has ended ({end})") and "ends its steps" in error.message
        assert error.hint == ENDED_HINTS.get(end.split(",")[0], error.hint) and "--resume" in error.hint
    assert "--no-kill" in ENDED_HINTS["NODE_FAIL"]
    # Still COMPLETING after a node failed (seen first, before NODE_FAIL): the node failure's hint.
    assert ended_error("n1", "7", "COMPLETING, reason NodeDown").hint == ENDED_HINTS["NODE_FAIL"]


@pytest.mark.parametrize("rc, stdout, stderr, expected", [
    (0, "JobId=7 JobState=RUNNING Reason=None NodeList=n[1-2]", "", None),
    (0, "JobId=7 JobState=RUNNING Reason=None NodeList=n1", "", "n2 is not in Slurm job 7's allocation (n1)"),
    (0, "JobId=7 JobState=NODE_FAIL Reason=NodeDown NodeList=n[1-2]", "", "Slurm job 7 has ended (NODE_FAIL"),
    (1, "", "slurm_load_jobs error: Invalid job id specified", "Slurm job 7 has ended (no longer known to Slurm)"),
    (1, "", "slurm_load_jobs error: Unable to contact slurm controller", None),             # cannot tell
])
def test_whether_a_node_is_gone_for_good_from_its_slurm_job(monkeypatch, rc, stdout, stderr, expected):
    import subprocess
    from cluster.transport import slurm
    monkeypatch.setattr(slurm.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, rc, stdout, stderr))
    gone = slurm.allocation_end("7", "n2")
    if expected is None:
        assert gone is None
    else:
        assert gone is not None and expected in gone.message
        assert gone.whole_job == ("has ended" in expected)
