"""In a Jupyter kernel (nbclient drives a real one), ``trainer.fit()`` shows one progress display and, with a
``LivePlotLogger``, one figure, each updated in place: the executed notebook holds one output of each, carrying the
last state, however many updates the kernel sent."""
import os

import pytest

CELLS = [
    """
import numpy as np
from flax import nnx
from jaxcomposer import ComposerClassifier, Trainer
from jaxcomposer.data import ArrayLoader
from jaxcomposer.loggers import LivePlotLogger
from jaxcomposer.models import MLP

rng = np.random.default_rng(0)
data = {"input": rng.normal(size=(64, 8)).astype(np.float32), "target": rng.integers(0, 2, 64).astype(np.int32)}
plot = LivePlotLogger()
trainer = Trainer(model=ComposerClassifier(MLP(8, (16,), 2, rngs=nnx.Rngs(0)), num_classes=2),
                  train_dataloader=ArrayLoader(data, 16), eval_dataloader=ArrayLoader(data, 32),
                  max_duration="4ba", eval_interval="1ba", loggers=[plot], seed=0)
""",
    "trainer.fit()\nprint('renders', plot.renders)",
]


@pytest.mark.slow
def test_fit_in_a_notebook_updates_one_progress_display_and_one_plot_in_place(tmp_path):
    import nbclient
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.strip()) for c in CELLS])
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    updates = []
    original = client.process_message

    def count_updates(msg, cell, cell_index):  # what the kernel sent: each update of a display
        if msg["msg_type"] == "update_display_data":
            updates.append("image/png" in msg["content"]["data"])
        return original(msg, cell, cell_index)

    client.process_message = count_updates
    client.execute(env={**os.environ, "MPLBACKEND": "Agg"})
    outputs = nb.cells[1].outputs
    kinds = [o["output_type"] for o in outputs]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    progress = [o for o in outputs if "text/html" in o.get("data", {}) and "<progress" in o["data"]["text/html"]]
    assert len(images) == 1 and len(progress) == 1, kinds
    assert "4/4" in progress[0]["data"]["text/plain"]  # the display shows the end of the run
    assert "stream" not in kinds[:-1] and "renders 5" in outputs[-1]["text"]  # 4 evaluations and the end
    assert updates.count(True) == 4 and updates.count(False) >= 1  # the plot redrawn in place 4 times
