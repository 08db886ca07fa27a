"""The pure parts of the in-process recovery mode: the sampler's slice per quorum, the discarded optimizer step,
the cross-replica average, and the peer transfer's format (nothing but tensors and plain values is ever loaded)."""
from __future__ import annotations

import io
import pickle
import threading
import time
from datetime import timedelta

import pytest
import torch

from azext_elastictrain.core import launch
from azext_elastictrain.runtime.data import ElasticSampler
from azext_elastictrain.runtime.handover import Handover
from azext_elastictrain.runtime.replica_data import ReplicaBatches, layout
from azext_elastictrain.runtime import replicas as replicas_module
from azext_elastictrain.runtime.replicas import (Quorum, ReplicaGroup, StepUndo, average_across_replicas, discard_step,
                                                 the_optimizer)

SECRET = "the-job's-secret"

SIZE, BATCH = 48, 12


class Ids(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> int:
        return index


def test_slice_follows_the_quorum_and_every_sample_is_trained_once() -> None:
    """3 replicas, then 2 (one lost), then 4 (two admitted): each step's slices join into its global batch."""
    samplers = [ElasticSampler(Ids(), BATCH, num_replicas=1, rank=0, seed=3) for _ in range(4)]
    loaders = [ReplicaBatches(s, s, epochs=2, node_rank=0, node_size=1) for s in samplers]
    order = samplers[0].order(0)
    worlds = [3, 3, 2, 4]  # participants at steps 1..4 (one epoch of 4 global batches)
    for step, size in enumerate(worlds):
        trained = []
        for rank in range(size):
            trained += loaders[rank].next(Quorum(step, size, rank))
        assert sorted(trained) == sorted(order[step * BATCH:(step + 1) * BATCH])
        for rank in range(4):
            if rank < size:
                loaders[rank].trained()
            else:  # not in this quorum: its position comes from a peer when it is admitted
                samplers[rank].load_state_dict(samplers[0].state_dict())


def test_a_discarded_step_trains_the_same_global_batch_again_at_the_new_layout() -> None:
    sampler = ElasticSampler(Ids(), BATCH, num_replicas=1, rank=0, seed=1)
    batches = ReplicaBatches(sampler, sampler, epochs=1, node_rank=0, node_size=1)
    first = batches.next(Quorum(0, 2, 0))
    batches.discarded()  # a peer died mid-step
    again = batches.next(Quorum(0, 1, 0))
    assert set(first) < set(again) and len(again) == BATCH
    assert sampler.consumed == 0


@pytest.mark.parametrize("consumed", [2 * BATCH, SIZE], ids=["mid-epoch", "epoch-boundary"])
def test_a_healing_replica_trains_the_peers_next_batch_with_it(consumed) -> None:
    """The newcomer loads the peer's position at the step's start, before either draws the step's batch: both take
    their slices of the same global batch, at an epoch's end too (there both move to the next epoch first; the
    newcomer used to skip a batch per epoch after such a heal)."""
    peer_sampler = ElasticSampler(Ids(), BATCH, num_replicas=1, rank=0, seed=0)
    peer = ReplicaBatches(peer_sampler, peer_sampler, epochs=3, node_rank=0, node_size=1)
    for _ in range(consumed // BATCH):
        peer.next(Quorum(0, 1, 0))
        peer.trained()
    new_sampler = ElasticSampler(Ids(), BATCH, num_replicas=1, rank=0, seed=0)
    newcomer = ReplicaBatches(new_sampler, new_sampler, epochs=3, node_rank=0, node_size=1)
    newcomer.next(Quorum(0, 1, 0))  # a stale iterator of its own, from before the heal
    new_sampler.load_state_dict(peer_sampler.state_dict())
    newcomer.healed()
    step = consumed // BATCH
    both = peer.next(Quorum(step, 2, 0)) + newcomer.next(Quorum(step, 2, 1))
    epoch, start = divmod(consumed, SIZE)
    assert sorted(both) == sorted(peer_sampler.order(epoch)[start:start + BATCH])
    peer.trained()
    newcomer.trained()
    assert peer_sampler.state_dict() == new_sampler.state_dict()


def test_layout_counts_the_node_workers() -> None:
    assert layout(Quorum(5, 3, 2), node_rank=1, node_size=2) == (6, 5)
    assert layout(Quorum(5, 3, None), node_rank=1, node_size=2) == (6, 1)


def test_reshard_refuses_a_world_the_global_batch_does_not_divide() -> None:
    sampler = ElasticSampler(Ids(), BATCH, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="not divisible by the world size 5"):
        sampler.reshard(5, 0)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
    lambda p: torch.optim.Adam(p, lr=0.1, weight_decay=0.1),
    lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.1),
], ids=["SGD", "Adam", "AdamW"])
def test_a_discarded_step_changes_neither_the_model_nor_the_optimizer(make) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = make(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()  # moments and step counts exist
    before_params = [p.detach().clone() for p in model.parameters()]
    before_state = pickle.dumps(optimizer.state_dict())
    model(torch.randn(2, 4)).sum().backward()
    discard_step(optimizer)
    optimizer.step()
    assert all(torch.equal(a, p) for a, p in zip(before_params, model.parameters()))
    assert pickle.dumps(optimizer.state_dict()) == before_state


@pytest.mark.parametrize("make", [
    lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5),
    lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1.0, total_steps=10),  # cycles momentum too
    lambda o: torch.optim.lr_scheduler.SequentialLR(
        o, [torch.optim.lr_scheduler.LinearLR(o, total_iters=2), torch.optim.lr_scheduler.ExponentialLR(o, 0.9)],
        milestones=[2]),
], ids=["StepLR", "OneCycleLR", "SequentialLR"])
def test_a_discarded_step_takes_back_the_schedulers_step(make) -> None:
    """The script steps its scheduler after optimizer.step() whatever the verdict; the step is trained again, so
    the schedule must not move on: the schedulers and the groups' hyperparameters come back as they were."""
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = make(optimizer)
    undo = StepUndo({"model": model, "nested": [{"optimizer": optimizer, "scheduler": scheduler}]}, optimizer)
    optimizer.step()
    scheduler.step()
    before = (pickle.dumps(scheduler.state_dict()), [dict(g, params=None) for g in optimizer.param_groups])
    undo.keep()
    optimizer.step()  # a discarded try: no update, but the script steps its scheduler
    scheduler.step()
    assert [dict(g, params=None) for g in optimizer.param_groups] != before[1]
    undo.undo()
    assert (pickle.dumps(scheduler.state_dict()), [dict(g, params=None) for g in optimizer.param_groups]) == before
    scheduler.step()  # and it goes on from there as an undisturbed one would
    twin_model = torch.nn.Linear(4, 3)
    twin_optimizer = torch.optim.SGD(twin_model.parameters(), lr=0.1, momentum=0.9)
    twin = make(twin_optimizer)
    for _ in range(2):
        twin_optimizer.step()
        twin.step()
    assert [g["lr"] for g in optimizer.param_groups] == [g["lr"] for g in twin_optimizer.param_groups]


def test_a_discarded_step_takes_back_the_scripts_own_learning_rate_change() -> None:
    """A hand-written warm-up sets the groups' lr in the body: as a restart from the step before would (the
    optimizer's state dict holds its groups), the discarded try's setting is taken back."""
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    undo = StepUndo({"model": model, "optimizer": optimizer}, optimizer)
    undo.keep()
    optimizer.param_groups[0]["lr"] = 0.5
    undo.undo()
    assert optimizer.param_groups[0]["lr"] == 0.1


class Tally:  # an object of the script's own with state_dict()/load_state_dict()
    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = state["seen"]


def test_a_discarded_step_takes_back_everything_in_the_state() -> None:
    """What users keep besides the model and optimizer: a counter, a generator, an EMA, BatchNorm's statistics, a
    tensor, nested plain values, an object with state_dict(), and the global RNGs; all as at the step's start,
    while the model's parameters and the optimizer's moments stay as the discard left them (untouched)."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.1)
    ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    state = {"model": net, "optimizer": optimizer, "ema": ema, "counter": 7, "noise": torch.Generator().manual_seed(3),
             "best": torch.tensor([1.5]), "log": {"losses": [0.5, 0.4], "tally": Tally()}}

    def body() -> None:  # one step as a script writes it; the verdict (discard) comes in the optimizer's hook
        x = torch.randn(16, 4) * (1 + torch.rand((), generator=state["noise"]))
        net(x).sum().backward()
        optimizer.step()
        ema.update_parameters(net)
        state["counter"] += 1
        state["best"] -= 0.1
        state["log"]["losses"].append(0.3)
        state["log"]["tally"].seen += 1

    body()  # a committed step: moments exist
    undo = StepUndo(state, optimizer)
    undo.keep()
    kept = pickle.dumps({k: v for k, v in state.items() if k not in ("model", "optimizer", "ema", "noise")})
    kept_tensors = [t.clone() for t in (*net.parameters(), *net.buffers(), *ema.parameters(), *ema.buffers(),
                                        state["noise"].get_state(), torch.get_rng_state())]
    kept_moments = pickle.dumps(optimizer.state_dict())
    optimizer.zero_grad()
    hook = optimizer.register_step_pre_hook(lambda opt, *_: discard_step(opt))  # the quorum's verdict: discard
    body()
    hook.remove()
    undo.undo()
    assert pickle.dumps({k: v for k, v in state.items() if k not in ("model", "optimizer", "ema", "noise")}) == kept
    assert all(torch.equal(a, b) for a, b in zip(kept_tensors, (
        *net.parameters(), *net.buffers(), *ema.parameters(), *ema.buffers(), state["noise"].get_state(),
        torch.get_rng_state())))
    assert pickle.dumps(optimizer.state_dict()) == kept_moments


def test_the_step_hook_ignores_torch_initialising_a_stateless_optimizer_on_another_thread() -> None:
    """Plain SGD (momentum 0) has no state, so torch's optimizer state dict initialises it by stepping it; torchft
    takes the state to send on its quorum thread, which then entered the step hook and waited on the quorum it
    was computing (the sending node hung). The hook acts on the training thread only."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    group = object.__new__(ReplicaGroup)  # only the hook's own fields: no coordinator in a unit test
    group._in_hook, group.committed, group._training_thread = False, None, threading.get_ident()

    def collective(*_):
        raise AssertionError("the quorum thread entered the step's collective")

    group._allreduce = collective
    optimizer.register_step_pre_hook(group._before_optimizer_step)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(get_optimizer_state_dict(model, optimizer)))
    worker.start()
    worker.join(timeout=30)
    assert result and not worker.is_alive()
    assert all(p.grad is None for p in model.parameters())  # torch's own initialisation left no gradient


def test_the_optimizer_is_found_once_when_a_scheduler_names_it_too() -> None:
    """{"model", "optimizer", "scheduler"} is the usual state; the scheduler's .optimizer is the same object."""
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"model": model, "optimizer": optimizer,
             "scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)}
    assert the_optimizer(state) is optimizer
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="exactly one optimizer"):
        the_optimizer({**state, "other": other})


def test_gradients_are_averaged_across_replicas_in_the_optimizer_order() -> None:
    params = [torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(1))]
    params[0].grad = torch.full((2, 2), 2.0)
    params[1].grad = torch.arange(3.0)
    # params[2] has no gradient: it counts as zeros, so every replica sends the same layout

    def allreduce(flat: torch.Tensor) -> None:  # another replica sent all ones: the average of the two, in place
        flat.add_(1).div_(2)

    average_across_replicas(params, allreduce)
    assert torch.equal(params[0].grad, torch.full((2, 2), 1.5))
    assert torch.equal(params[1].grad, torch.tensor([0.5, 1.0, 1.5]))
    assert torch.equal(params[2].grad, torch.tensor([0.5]))


def test_a_parameter_without_a_gradient_on_every_replica_keeps_none_and_one_used_elsewhere_gets_the_average() -> None:
    """As after one DDP run's backward: AdamW skips a parameter without a gradient (an unused head), and decays
    one with a zero gradient, so a zero where no replica had a gradient would move it on every step."""
    def replica(expert_used: bool) -> list[torch.nn.Parameter]:
        params = [torch.nn.Parameter(torch.ones(2)) for _ in range(3)]  # trunk, expert, unused head
        params[0].grad = torch.full((2,), 4.0)
        if expert_used:
            params[1].grad = torch.full((2,), 2.0)
        return params

    sent: list[torch.Tensor] = []
    average_across_replicas(replica(expert_used=True), lambda flat: sent.append(flat.clone()))
    ours = replica(expert_used=False)
    average_across_replicas(ours, lambda flat: flat.add_(sent[0]).div_(2))  # the two replicas' average
    assert torch.equal(ours[0].grad, torch.full((2,), 4.0))
    assert torch.equal(ours[1].grad, torch.full((2,), 1.0))  # used on the other replica: (2 + 0) / 2, as DDP
    assert ours[2].grad is None  # used nowhere: no gradient, so the optimizer leaves it be
    adamw = torch.optim.AdamW(ours, lr=0.1, weight_decay=0.1)
    adamw.step()
    assert torch.equal(ours[2].detach(), torch.ones(2))


class Evil:
    def __reduce__(self):
        return (print, ("code ran in the receiver",))


def test_peer_transfer_round_trips_state_and_refuses_arbitrary_objects() -> None:
    pytest.importorskip("torchft")
    from azext_elastictrain.runtime.peer_transfer import Destination, PeerStateError, PeerTransport, read_state

    sender, receiver = (PeerTransport("127.0.0.1", timeout=lambda: timedelta(seconds=5), secret=SECRET,
                                      bind="127.0.0.1") for _ in range(2))
    try:
        state = {"user": {"flat": {"model.weight": torch.ones(2), "data.epoch": 1, "opt.param_groups": [{"lr": 0.1}]}},
                 "torchft": {"step": 7, "batches_committed": 7}}
        sender.send_checkpoint([1], 7, state, timedelta(seconds=5))
        got = receiver.recv_checkpoint(0, sender.metadata(), 7, timedelta(seconds=5))
        assert torch.equal(got["user"]["flat"]["model.weight"], torch.ones(2))
        assert got["user"]["flat"]["opt.param_groups"] == [{"lr": 0.1}] and got["torchft"]["step"] == 7
        with pytest.raises(TypeError, match="Evil cannot be sent"):  # nothing is pickled: refused at the source
            sender.send_checkpoint([1], 8, {"x": Evil()}, timedelta(seconds=5))
        buffer = io.BytesIO()
        torch.save({"x": Evil()}, buffer)  # a pickle where the state should be: not read at all
        with pytest.raises(PeerStateError, match="not a state in elastictrain's format"):
            read_state(io.BytesIO(buffer.getvalue()), None, Destination(), time.monotonic() + 5)
    finally:
        sender.shutdown()
        receiver.shutdown()


def test_the_state_server_refuses_a_request_without_the_jobs_secret_and_listens_on_its_address_only() -> None:
    """It serves the whole model: a process that reaches the port without the job's secret gets a 403 (a wrong
    secret, none at all, another scheme), whatever step it asks for; it listens on the address given, not on all."""
    pytest.importorskip("torchft")
    import urllib.error
    import urllib.request

    from azext_elastictrain.runtime.peer_transfer import PATH, PeerTransport

    sender = PeerTransport("127.0.0.1", timeout=lambda: timedelta(seconds=5), secret=SECRET, bind="127.0.0.1")
    stranger = PeerTransport("127.0.0.1", timeout=lambda: timedelta(seconds=1), secret="not-the-job's",
                             bind="127.0.0.1")
    try:
        sender.send_checkpoint([1], 4, {"x": torch.ones(2)}, timedelta(seconds=5))
        assert sender.metadata().startswith("http://127.0.0.1:")
        assert sender._server.server_address[0] == "127.0.0.1"  # pylint: disable=protected-access
        url = f"{sender.metadata()}{PATH}4"
        for headers in ({}, {"Authorization": "Bearer not-the-job's"}, {"Authorization": SECRET},
                        {"Authorization": f"Basic {SECRET}"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5)
            assert refused.value.code == 403, headers
        with pytest.raises(urllib.error.HTTPError, match="403"):
            stranger.recv_checkpoint(0, sender.metadata(), 4, timedelta(seconds=1))
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Bearer {SECRET}"}),
                                    timeout=5) as answer:
            assert answer.status == 200
    finally:
        sender.shutdown()
        stranger.shutdown()


def test_the_jobs_secret_comes_from_the_environment_or_its_file_and_none_is_refused(tmp_path) -> None:
    pytest.importorskip("torchft")
    from azext_elastictrain.backends.local.agent import job_secret_file, write_job_secret
    from azext_elastictrain.runtime.peer_transfer import JobSecretMissing, job_secret

    assert job_secret({launch.ENV_JOB_SECRET: "s3"}) == "s3"
    made = write_job_secret(tmp_path)
    assert made == job_secret_file(tmp_path) and (made.stat().st_mode & 0o777) == 0o600
    assert write_job_secret(tmp_path).read_text() == made.read_text(), "made once: later nodes share it"
    assert job_secret({launch.ENV_JOB_SECRET_FILE: str(made)}) == made.read_text() and len(made.read_text()) >= 32
    with pytest.raises(JobSecretMissing, match=launch.ENV_JOB_SECRET):
        job_secret({})
    with pytest.raises(JobSecretMissing, match="cannot be read"):
        job_secret({launch.ENV_JOB_SECRET_FILE: str(tmp_path / "none")})


def test_peer_transfer_waits_as_long_as_the_state_needs_not_torchfts_timeout() -> None:
    """torchft passes its Manager's timeout (the replica timeout: 2 s locally); a state that takes longer to
    serialise must still arrive, so the receiver keeps to the transport's own, sized to the state."""
    pytest.importorskip("torchft")
    from azext_elastictrain.runtime.peer_transfer import PeerTransport

    sender, receiver = (PeerTransport("127.0.0.1", timeout=lambda: timedelta(seconds=10), secret=SECRET,
                                      bind="127.0.0.1") for _ in range(2))
    try:
        late = threading.Timer(1.0, sender.send_checkpoint, ([1], 3, {"x": torch.ones(3)}, timedelta(seconds=5)))
        late.start()
        got = receiver.recv_checkpoint(0, sender.metadata(), 3, timedelta(seconds=0.2))
        assert torch.equal(got["x"], torch.ones(3))
        late.join()
    finally:
        sender.shutdown()
        receiver.shutdown()


def test_a_grad_scaler_needs_a_ddp_model_whose_gradients_the_nodes_average_before_it_looks() -> None:
    """With a DDP the nodes' average is in backward(), so every node's scaler sees the same gradients and skips
    the same steps (the battery's plain variant); without one each would decide on its own node's gradients."""
    import torch.distributed as dist

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    the_optimizer({"model": model, "optimizer": optimizer})
    with pytest.raises(ValueError, match="GradScaler only with a DistributedDataParallel.*--recovery restart"):
        the_optimizer({"model": model, "optimizer": optimizer, "amp": {"scaler": torch.amp.GradScaler("cpu")}})
    # GradScaler(enabled=use_amp) with AMP off only steps the optimizer
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    assert the_optimizer({"model": model, "optimizer": optimizer, "scaler": disabled}) is optimizer
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = {"model": ddp, "optimizer": optimizer, "scaler": torch.amp.GradScaler("cpu")}
        assert the_optimizer(state) is optimizer
    finally:
        dist.destroy_process_group()


def test_a_healing_step_waits_for_the_transfer_sized_to_the_state() -> None:
    pytest.importorskip("torchft")
    from azext_elastictrain.runtime import replicas

    replica = timedelta(seconds=2)
    model = torch.nn.Linear(1024, 1024)  # 4 MiB of weights, 4 KiB of bias
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"model": model, "optimizer": optimizer, "pad": torch.zeros(100 * 2**18)}  # + 100 MiB
    size = (1024 * 1024 + 1024) * 4 + 100 * 2**20
    expected = replica + timedelta(seconds=size / replicas.TRANSFER_FLOOR_BYTES_PER_SECOND)
    assert replicas.transfer_timeout(state, replica) == expected
    assert expected > replica + timedelta(seconds=2)  # ~2 s more per 100 MiB at the floor rate

    # read from the live objects: torch's optimizer state dict would step a fresh optimizer to create its moments,
    # re-entering the step hook from torchft's quorum thread (a deadlock)
    fresh = torch.optim.AdamW(model.parameters())
    assert replicas.state_bytes({"optimizer": fresh}) == 0 and not fresh.state
    model(torch.ones(1, 1024)).sum().backward()
    fresh.step()
    assert replicas.state_bytes({"optimizer": fresh}) == 2 * (1024 * 1024 + 1024) * 4 + 2 * 4  # moments + steps


# -- the cross-node timeout: one owner (core/launch.py), set by each backend for in-process jobs only -------------
def test_each_backend_sets_its_replica_timeout_for_in_process_jobs_only() -> None:
    from azext_elastictrain.core import launch
    from azext_elastictrain.core.spec import job_env
    from azext_elastictrain.core.spec import JobSpec

    local = job_env(JobSpec(name="job", script="t.py", recovery=launch.RECOVERY_IN_PROCESS), launch.LOCAL)
    assert local[launch.ENV_REPLICA_TIMEOUT] == "2"
    restart = job_env(JobSpec(name="job", script="t.py", recovery=launch.RECOVERY_RESTART), launch.LOCAL)
    assert launch.ENV_REPLICA_TIMEOUT not in restart
    # shorter than the restart mode's collective timeout: a false timeout costs a discarded step, not a re-form
    assert launch.LOCAL.replica_timeout_seconds < launch.LOCAL.collective_timeout_seconds
    assert launch.AKS.replica_timeout_seconds < launch.AKS.collective_timeout_seconds


def test_the_replica_timeout_is_torchfts_variable_then_the_backends_then_the_collective_timeout() -> None:
    from azext_elastictrain.core import launch
    from azext_elastictrain.runtime.timeouts import replica_timeout

    both = {"TORCHFT_TIMEOUT_SEC": "3", launch.ENV_REPLICA_TIMEOUT: "2", launch.ENV_COLLECTIVE_TIMEOUT: "10"}
    assert replica_timeout(both) == timedelta(seconds=3)
    assert replica_timeout({launch.ENV_REPLICA_TIMEOUT: "1.5", launch.ENV_COLLECTIVE_TIMEOUT: "10"}) == \
        timedelta(seconds=1.5)  # the old reading took int(TORCHFT_TIMEOUT_SEC) only: no fraction of a second
    assert replica_timeout({launch.ENV_COLLECTIVE_TIMEOUT: "7"}) == timedelta(seconds=7)
    with pytest.raises(ValueError, match="ELASTICTRAIN_REPLICA_TIMEOUT_SECONDS"):
        replica_timeout({launch.ENV_REPLICA_TIMEOUT: "soon"})


@pytest.mark.parametrize("given_up, healed_at, expected", [
    (0, None, 1),  # nothing gone: one try
    (1, 0, 2),  # a node gone during the first try's start (which healed this one): a second quorum at once
    (99, None, replicas_module.START_TRIES),  # gone again and again: the tries end, the step is discarded
])
def test_a_start_given_up_on_a_node_gone_asks_for_a_new_quorum_before_any_body(given_up, healed_at, expected) -> None:
    group = object.__new__(ReplicaGroup)
    group.handover = Handover(None)
    tries: list[int] = []

    def begin(_last_step: int, _salvageable: bool) -> Quorum:
        tries.append(len(tries))
        group.healed = len(tries) - 1 == healed_at
        group._start_given_up = len(tries) <= given_up
        return Quorum(step=7, participants=4 - len(tries), rank=0)

    group._begin = begin
    quorum = group.begin_step(7)
    assert len(tries) == expected and quorum.participants == 4 - expected
    assert group.healed == (healed_at is not None)  # a heal in an earlier try stays known to the loop


def test_a_departing_node_whose_start_was_given_up_leaves_instead_of_asking_for_a_quorum() -> None:
    """Its heartbeats stopped (runtime/handover.py): it has no server to ask with; the loop sees ``done``."""
    group = object.__new__(ReplicaGroup)
    group.handover = Handover(0.5, leaving=True, stopped_at=1.0, departing=1, hold=True)
    tries: list[int] = []

    def begin(_last_step: int, _salvageable: bool) -> Quorum:
        tries.append(len(tries))
        group.healed, group._start_given_up = False, True
        group.handover.failed()
        return Quorum(step=7, participants=3, rank=2)

    group._begin = begin
    group.begin_step(7)
    assert tries == [0] and group.handover.done


class FakeManager:
    """torchft's Manager as ``_salvage_step`` calls it: the quorum of the survivors it is given."""

    def __init__(self, rank: int | None, participants: int, fails: Exception | None = None) -> None:
        self.rank, self.participants, self.fails = rank, participants, fails
        self.reported: list[Exception] = []
        self.quorums: list[dict] = []

    def start_quorum(self, **kwargs) -> None:
        self.quorums.append(kwargs)
        if self.fails is not None:
            raise self.fails

    def participating_rank(self) -> int | None:
        return self.rank

    def num_participants(self) -> int:
        return self.participants

    def errored(self):
        return None

    def report_error(self, ex: Exception) -> None:
        self.reported.append(ex)


class SummingGroup:
    """The survivors' second collective: this node's tensor plus another survivor's (``other``), in place."""

    def __init__(self, other: torch.Tensor) -> None:
        self.other = other
        self.steps = 0

    def next_step(self) -> None:
        self.steps += 1

    def allreduce(self, tensors, _options):
        tensors[0].add_(self.other)
        return None

    def wait(self, _work) -> None:
        pass

    def agree(self) -> None:
        pass


def salvaging_group(manager: FakeManager, other: torch.Tensor) -> ReplicaGroup:
    from datetime import timedelta

    from azext_elastictrain.runtime.salvage import Salvage

    group = object.__new__(ReplicaGroup)
    group.manager, group._pg, group.device = manager, SummingGroup(other), torch.device("cpu")
    group.timeout, group.salvage = timedelta(seconds=30), Salvage(enabled=True)
    group.rank, group._participants = 0, 3
    return group


def test_a_salvaged_step_averages_what_the_survivors_kept_and_names_the_gone_ranks_slice() -> None:
    """Rank 0 of 3 kept [1, 1] (its gradients, the used-flags after them); rank 1 kept [3, 3]; rank 2 is gone."""
    manager = FakeManager(rank=0, participants=2)
    group = salvaging_group(manager, other=torch.tensor([3.0, 3.0, 0.0, 1.0, 0.0]))  # rank 1's, and its presence
    flat = torch.tensor([9.0, 9.0])  # what the given-up collective left in the buffer: never read
    group._salvage_step(torch.tensor([1.0, 1.0]), flat, RuntimeError("rank 2 has not beaten"))
    assert torch.equal(flat, torch.tensor([2.0, 2.0])) and group.salvage.lost == [2]
    assert manager.quorums == [{"allow_heal": False, "shrink_only": True}] and not manager.reported
    assert (group.rank, group._participants, group._pg.steps) == (0, 2, 1)


@pytest.mark.parametrize("manager", [FakeManager(rank=0, participants=3), FakeManager(rank=None, participants=2),
                                     FakeManager(rank=0, participants=2, fails=TimeoutError("no coordinator"))])
def test_a_salvage_without_a_smaller_quorum_of_the_survivors_discards_the_step(manager) -> None:
    """Nobody left (a node taken for gone wrongly), this node not in the survivors' quorum, or no quorum at all: the
    step is discarded as without salvage (the error reported to torchft fails its commit)."""
    group = salvaging_group(manager, other=torch.zeros(5))
    flat = torch.tensor([9.0, 9.0])
    group._salvage_step(torch.tensor([1.0, 1.0]), flat, RuntimeError("rank 2 has not beaten"))
    assert len(manager.reported) == 1 and group.salvage.lost == [] and group._participants == 3


def test_a_heal_before_the_first_step_leaves_both_optimizers_unstepped_as_in_an_uninterrupted_run():
    """A node that sends its state before its first step (the job's start: the others take the first node's) and the
    one that receives it: torch's state-dict API made a fresh optimizer's state by a zero-gradient step, so AdamW's
    first real step counted as its second on both (its bias correction one step off: the update x0.74, seen as the
    replicas parting from the lone run at step 1). Both now take the first step an uninterrupted run takes; a
    stepped optimizer's state is sent whole."""
    from azext_elastictrain.runtime import entries
    from azext_elastictrain.runtime.replicas import served_state
    from tests.support.states import adamw_replica, assert_first_steps_alike

    (sender, sender_opt), (receiver, receiver_opt) = adamw_replica(), adamw_replica()
    alone, alone_opt = adamw_replica()
    flat = served_state({"model": sender, "optimizer": sender_opt})
    assert not sender_opt.state
    tree = entries.tree({"model": receiver, "optimizer": receiver_opt})  # as ReplicaGroup._load does
    tree.forget(tree.absent_groups(flat))
    tree.apply({key: flat[key] for key in tree.flat})
    assert not receiver_opt.state
    assert_first_steps_alike([(sender, sender_opt), (receiver, receiver_opt)], (alone, alone_opt))
    stepped = served_state({"model": alone, "optimizer": alone_opt})
    assert any(".state." in key for key in stepped) and alone_opt.state  # a stepped optimizer: whole, untouched


def test_the_source_view_of_an_unstepped_training_state_leaves_its_optimizer_unstepped():
    """TrainingState's optimizer too (state.py ``_unstepped``): read for a save or a heal without torch's
    zero-gradient step, its one empty ``state`` item in place of per-parameter state; the view a load fills is
    unchanged (torch's template, to receive into)."""
    from azext_elastictrain.runtime import entries
    from azext_elastictrain.runtime.state import TrainingState
    from tests.support.states import adamw_replica

    model, optimizer = adamw_replica()
    state = {"run": TrainingState(model, optimizer)}
    flat = entries.tree(state, source=True).flat
    assert not optimizer.state and flat["run.optim.state"] == {}
    assert not any(key.startswith("run.optim.state.") for key in flat)
    loading = entries.tree(state).flat
    assert any(key.startswith("run.optim.state.") for key in loading) and optimizer.state


def test_the_source_view_of_an_unstepped_sharded_optimizer_leaves_it_unstepped():
    """FSDP2 (DTensor parameters, torch's state-dict API for a sharded model): a save or a heal before the first
    step reads the optimizer without stepping it, and its first step is an unsharded run's."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from azext_elastictrain.runtime import entries
    from tests.support.states import adamw_replica

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model, _ = adamw_replica()
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        flat = entries.tree({"model": model, "optimizer": optimizer}, source=True).flat
        assert not optimizer.state and flat["optimizer.state"] == {}
        assert all(p.grad is None for p in model.parameters())
        alone, alone_opt = adamw_replica()
        x = torch.randn(6, 8)
        for net, opt in ((model, optimizer), (alone, alone_opt)):
            net(x).pow(2).mean().backward()
            opt.step()
        assert all(torch.equal(p.full_tensor(), q) for p, q in zip(model.parameters(), alone.parameters()))
    finally:
        dist.destroy_process_group()
