"""``pip install jaxcomposer`` without its extras: each feature whose backend is missing names the extra that
installs it, and the rest works. Run in a subprocess whose imports of torch, tensorflow_datasets and matplotlib
fail as they do where those packages are not installed."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import importlib.abc, importlib.util, sys, warnings
    MISSING = ("torch", "torchvision", "tensorflow_datasets", "matplotlib", "obstore")

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in MISSING:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, NotInstalled())
    real_find_spec = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in MISSING else real_find_spec(name, *a)

    def says(fn, *needles):
        try:
            fn()
        except ImportError as e:
            assert all(n in str(e) for n in needles), str(e)
            return
        raise AssertionError(f"{fn} did not raise")

    import numpy as np
    from flax import nnx
    import jaxcomposer
    from jaxcomposer.core import adapters
    from jaxcomposer.loggers import PlotLogger
    from jaxcomposer.data.tfds_adapter import open_tfds_source

    assert not adapters.installed("torch")
    says(lambda: jaxcomposer.ComposerModel, "pip install jaxcomposer[torch]")
    says(lambda: __import__("torch_bridge"), "pip install jaxcomposer[torch]")
    says(lambda: PlotLogger("/tmp/never.png").save(), "PlotLogger needs matplotlib", "jaxcomposer[plots]")
    says(lambda: open_tfds_source("mnist", "train", None), "tensorflow-datasets", "jaxcomposer[tfds]")
    from jaxcomposer.utils.object_store import RemoteFolder
    says(lambda: RemoteFolder("s3://bucket/run"), "save_folder='s3://bucket/run' needs obstore", "jaxcomposer[remote]")

    # training works without them; the run directory gets no plot, and says why
    from jaxcomposer import ComposerClassifier, Trainer
    from jaxcomposer.models import MLP
    x = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    loader = [{"input": x, "target": (x[:, 0] > 0).astype(np.int32)}] * 2
    import tempfile
    with warnings.catch_warnings(record=True) as caught, tempfile.TemporaryDirectory() as run_dir:
        warnings.simplefilter("always")
        trainer = Trainer(model=ComposerClassifier(MLP(4, (8,), 2, rngs=nnx.Rngs(0)), num_classes=2),
                          train_dataloader=loader, max_duration="2ba", run_dir=run_dir, progress_bar=False, seed=0)
        trainer.fit()
    assert any("jaxcomposer[plots]" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert int(trainer.state.timestamp.batch) == 2
    assert not any(m.split(".")[0] in MISSING for m in sys.modules)
    print("ok")
''')


def test_features_name_their_missing_extra_and_training_works_without_them():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr
