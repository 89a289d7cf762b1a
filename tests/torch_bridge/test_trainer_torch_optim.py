"""A Composer user's torch optimizer in jaxcomposer's Trainer: it trains as torch's own ``step()`` would (a plain
torch loop over the same batches is the reference), it holds the run's state afterwards (momentum buffers, ``lr``),
and a second Trainer on the same optimizer continues where the first stopped. The optimizer's update rules alone
are checked against torch in test_torch_optim.py."""
import copy

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer.errors import ConfigurationError
from jaxcomposer.optim import LinearScheduler
from jaxcomposer.trainer import Trainer
from tests.torch_bridge.parity import LAYER_TOL

pytestmark = pytest.mark.xdist_group("test_trainer_torch_optim")


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _sgd(net):  # two groups with their own options, as Composer scripts build them
    return torch.optim.SGD([{"params": net[0].parameters(), "lr": 0.05},
                            {"params": net[2].parameters(), "weight_decay": 0.01, "nesterov": True}],
                           lr=0.1, momentum=0.9)


def _torch_loop(net, optimizer, batches, lrs=None):
    loss_fn = torch.nn.CrossEntropyLoss()
    for i, (x, y) in enumerate(batches):
        if lrs is not None:
            for group, base in zip(optimizer.param_groups, [g["initial_lr"] for g in optimizer.param_groups]):
                group["lr"] = base * lrs[i]
        optimizer.zero_grad()
        loss_fn(net(x), y).backward()
        optimizer.step()


def _fit(net, optimizer, duration, **kwargs):
    trainer = Trainer(model=net, optimizers=optimizer, max_duration=duration, progress_bar=False,
                      train_dataloader=DataLoader(_data(), batch_size=16), **kwargs)
    trainer.fit()
    return trainer


def _assert_same(a: torch.nn.Module, b: torch.nn.Module):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=0, atol=LAYER_TOL, msg=name)


@pytest.mark.parametrize("make", [
    _sgd,
    lambda net: torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1, amsgrad=True),
    lambda net: torch.optim.RMSprop(net.parameters(), lr=0.01, momentum=0.5, centered=True),
], ids=["sgd_groups", "adamw_amsgrad", "rmsprop"])
def test_trains_as_torch_steps_and_leaves_the_state_in_the_optimizer(make):
    net, ref = _net(), _net()
    optimizer, ref_optimizer = make(net), make(ref)
    trainer = _fit(net, optimizer, "1ep")
    _torch_loop(ref, ref_optimizer, DataLoader(_data(), batch_size=16))
    _assert_same(net, ref)
    assert trainer.state.optimizers == [optimizer]
    ours, theirs = optimizer.state_dict(), ref_optimizer.state_dict()
    assert ours["state"].keys() == theirs["state"].keys()
    for i, entries in theirs["state"].items():
        assert list(ours["state"][i]) == list(entries)  # torch's names, in torch's order
        for name, value in entries.items():
            torch.testing.assert_close(ours["state"][i][name], value, rtol=0, atol=LAYER_TOL, msg=f"{i}.{name}")
    assert [g["lr"] for g in optimizer.param_groups] == [g["lr"] for g in ref_optimizer.param_groups]


def test_a_second_trainer_on_the_same_optimizer_continues():
    net, ref = _net(), _net()
    optimizer, ref_optimizer = _sgd(net), _sgd(ref)
    _fit(net, optimizer, "2ba")
    _fit(net, optimizer, "1ep")  # a new Trainer: its first 3 batches, seeded from the optimizer's momentum
    batches = list(DataLoader(_data(), batch_size=16))
    _torch_loop(ref, ref_optimizer, batches[:2] + batches)
    _assert_same(net, ref)
    torch.testing.assert_close(optimizer.state_dict()["state"][3]["momentum_buffer"],
                               ref_optimizer.state_dict()["state"][3]["momentum_buffer"], rtol=0, atol=LAYER_TOL)


def test_a_schedule_scales_every_group_and_the_groups_keep_the_current_lr():
    net, ref = _net(), _net()
    optimizer, ref_optimizer = _sgd(net), _sgd(ref)
    for group in ref_optimizer.param_groups:
        group["initial_lr"] = group["lr"]
    _fit(net, optimizer, "3ba", schedulers=[LinearScheduler(alpha_i=1.0, alpha_f=0.0, t_max="4ba")])
    _torch_loop(ref, ref_optimizer, list(DataLoader(_data(), batch_size=16)), lrs=[1.0, 0.75, 0.5])
    _assert_same(net, ref)
    # after 3 of the 4 scheduled batches: the LR the next step would use, as a torch scheduler leaves it
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.05 * 0.25, 0.1 * 0.25])
    assert [g["initial_lr"] for g in optimizer.param_groups] == [0.05, 0.1]


def test_lr_zero_is_allowed_and_trains_nothing():
    net = _net()
    before = copy.deepcopy(net.state_dict())
    _fit(net, torch.optim.SGD(net.parameters(), lr=0.0), "2ba")
    for name, value in net.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_refused_before_anything_is_exported():
    net = _net()
    with pytest.raises(ConfigurationError, match="Adadelta"):
        _fit(net, torch.optim.Adadelta(net.parameters()), "1ba")
    with pytest.raises(ConfigurationError, match="not one of the model's parameters"):
        _fit(net, torch.optim.SGD(_net().parameters(), lr=0.1), "1ba")
    with pytest.raises(ConfigurationError, match="optimizers: got builtins.str"):
        _fit(net, "sgd", "1ba")


def test_lr_monitor_reads_each_groups_current_lr_as_composer_logs_it():
    from jaxcomposer.callbacks import LRMonitor
    from jaxcomposer.loggers import InMemoryLogger

    net, logger = _net(), InMemoryLogger()
    _fit(net, _sgd(net), "3ba", schedulers=[LinearScheduler(alpha_i=1.0, alpha_f=0.0, t_max="4ba")],
         callbacks=[LRMonitor()], loggers=[logger])
    # after batch b the LR of the next step, as Composer's scheduler leaves the group: alpha 0.75, 0.5, 0.25
    assert [v for _, v in logger.data["lr-SGD/group0"]] == pytest.approx([0.05 * a for a in (0.75, 0.5, 0.25)])
    assert [v for _, v in logger.data["lr-SGD/group1"]] == pytest.approx([0.1 * a for a in (0.75, 0.5, 0.25)])


@pytest.mark.parametrize("every_batch", [False, True], ids=["per_epoch", "every_batch"])
def test_a_torch_lr_scheduler_steps_as_composer_steps_it(every_batch):
    """Composer steps PyTorch schedulers at each epoch's end, or after every batch with
    step_schedulers_every_batch=True; the trained weights and the groups' LR are those of that torch loop."""
    def make(net):
        optimizer = _sgd(net)
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

    net, ref = _net(), _net()
    (optimizer, scheduler), (ref_optimizer, ref_scheduler) = make(net), make(ref)
    trainer = _fit(net, optimizer, "3ep", schedulers=scheduler, step_schedulers_every_batch=every_batch)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(3):
        for x, y in DataLoader(_data(), batch_size=16):
            ref_optimizer.zero_grad()
            loss_fn(ref(x), y).backward()
            ref_optimizer.step()
            if every_batch:
                ref_scheduler.step()
        if not every_batch:
            ref_scheduler.step()
    _assert_same(net, ref)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([g["lr"] for g in ref_optimizer.param_groups])
    assert scheduler.last_epoch == ref_scheduler.last_epoch == (9 if every_batch else 3)
    assert trainer.state.schedulers == [scheduler]


def test_torch_schedulers_are_refused_where_they_cannot_mean_what_they_say():
    net = _net()
    optimizer = _sgd(net)
    other = torch.optim.SGD(_net().parameters(), lr=0.1)
    with pytest.raises(ConfigurationError, match="built on another optimizer"):
        _fit(net, optimizer, "1ba", schedulers=torch.optim.lr_scheduler.StepLR(other, 1))
    with pytest.raises(ConfigurationError, match="ReduceLROnPlateau"):
        _fit(net, optimizer, "1ba", schedulers=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer))
    with pytest.raises(ConfigurationError, match="scales the param groups differently"):
        _fit(net, optimizer, "2ba", schedulers=torch.optim.lr_scheduler.LambdaLR(
            optimizer, [lambda e: 1.0, lambda e: 0.5]))


def _cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 3))


def test_surgery_keeps_a_torch_optimizer_on_the_new_layers():
    """Composer's surgery takes the optimizers (state.optimizers in the Trainer, optimizers= in the functional form):
    BlurPool's new BlurConv2d holds new parameters, which the optimizer then holds in place of the old ones."""
    from jaxcomposer import functional as cf
    from jaxcomposer.algorithms import BlurPool

    net = _cnn()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    old = net[2].weight
    cf.apply_blurpool(net, optimizers=optimizer)
    held = [p for g in optimizer.param_groups for p in g["params"]]
    assert {id(p) for p in held} == {id(p) for p in net.parameters()} and all(p is not old for p in held)

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(32, 3, 8, 8, generator=g), torch.randint(0, 3, (32,), generator=g))
    net, ref = _cnn(), _cnn()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)  # built before the Trainer's surgery
    trainer = Trainer(model=net, optimizers=optimizer, algorithms=[BlurPool()], max_duration="2ba",
                      train_dataloader=DataLoader(data, batch_size=16), progress_bar=False)
    trainer.fit()
    cf.apply_blurpool(ref)  # the same surgery, then torch's own steps
    ref_optimizer = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    _torch_loop(ref, ref_optimizer, DataLoader(data, batch_size=16))
    _assert_same(net, ref)
    assert len(optimizer.state) == len(list(net.parameters()))  # momentum for every (new) parameter

    two_groups = _cnn()
    optimizer = torch.optim.SGD([{"params": two_groups[0].parameters()}, {"params": two_groups[2].parameters()}],
                                lr=0.1)
    with pytest.raises(ConfigurationError, match="param groups; the new parameters could join any"):
        cf.apply_blurpool(two_groups, optimizers=optimizer)
    with pytest.raises(TypeError, match="optimizers= keeps a torch optimizer"):
        from flax import nnx

        from jaxcomposer.models import ConvNet
        cf.apply_blurpool(ConvNet((8, 16), (2, 2), in_channels=3, image_size=8, rngs=nnx.Rngs(0)),
                          optimizers=optimizer)

