"""hvd.elastic.run with a host discovery script, the way Horovod's own
elastic test script (test/integration/data/elastic_torch_main.py) drives
it: a discovery schedule (how many slots the host has from which epoch)
that the script prints, rank 0 waiting on `state._host_messages` for the
driver's notification before it commits, and every rank raising
HostsUpdatedInterrupt at that commit: slots added (the job grows into
them, its state synchronised from rank 0) and removed (the job leaves the
extra worker and goes on without a rollback, rank 0 staying rank 0). kolo's
notifications come from the coordinator; `state._host_messages` is
Horovod's queue read from them (issue 30, item 4). Hosts leaving the list
and a failing script: tests/integration/test_elastic_discovery.sh."""
import re
import stat

from conftest import kolo_run

WORKER = r'''
import json, sys, time, torch
import kolo.torch as hvd

hosts_file, schedule = sys.argv[1], json.loads(sys.argv[2])   # [[epoch, slots], ...]
hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0, batch=0, commits=0)


def slots_at(epoch):
    n = schedule[0][1]
    for e, s in schedule:
        if epoch >= e:
            n = s
    return n


@hvd.elastic.run
def train(state):
    while state.epoch < 5:
        for state.batch in range(state.batch, 3):
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
        print("EPOCH %d size %d" % (state.epoch, hvd.size()), flush=True)
        nxt = slots_at(state.epoch + 1)
        if hvd.rank() == 0 and nxt != slots_at(state.epoch):
            with open(hosts_file, "w") as f:
                f.write("localhost:%d\n" % nxt)
            start = time.time()
            state._last_updated_timestamp = 0   # as Horovod's script does
            while state._host_messages.empty():
                if time.time() - start > 30:
                    raise TimeoutError("Timed out waiting for notifications from driver.")
                time.sleep(0.1)
            print("NOTIFIED", flush=True)
        state.epoch += 1
        state.batch = 0
        state.commits += 1
        state.commit()


state.register_reset_callbacks([lambda: print("RESET size %d" % hvd.size(), flush=True)])
train(state)
w = torch.cat([p.detach().flatten() for p in model.parameters()])
print("FINAL epoch %d %s" % (state.epoch, [round(x, 5) for x in w.tolist()]), flush=True)
'''


def test_hosts_added_and_removed_by_the_discovery_schedule(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % hosts)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    schedule = "[[0, 2], [2, 3], [3, 2]]"
    job = kolo_run(2, WORKER, args=(str(hosts), schedule), timeout=200,
                   kolo_args=("--min-np", "1", "--max-np", "3", "--slots", "3",
                              "--host-discovery-script", str(script)))
    assert job.rc == 0, job
    sizes = {}
    for line in job.lines():
        m = re.match(r"EPOCH (\d+) size (\d+)$", line)
        if m:
            sizes.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    assert sizes == {0: {2}, 1: {2}, 2: {3}, 3: {2}, 4: {2}}, sizes
    assert job.lines(0).count("NOTIFIED") == 2, job
    assert len([l for l in job.lines() if l == "RESET size 3"]) == 2, job
    assert len([l for l in job.lines() if l == "RESET size 2"]) == 2, job
    # every rank that finished agrees on the weights (the state was synced)
    finals = [l.split(" ", 3)[3] for l in job.lines() if l.startswith("FINAL epoch 5 ")]
    assert len(finals) == 2 and len(set(finals)) == 1, job
