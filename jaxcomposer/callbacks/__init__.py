"""Host callbacks (Composer's ``composer.callbacks``): monitors, stoppers, export, visualization, generation and
checkpoint loading."""
from jaxcomposer.callbacks.activation_monitor import ActivationMonitor
from jaxcomposer.callbacks.checkpoint_saver import CheckpointSaver
from jaxcomposer.callbacks.export_for_inference import ExportForInferenceCallback
from jaxcomposer.callbacks.free_outputs import FreeOutputs
from jaxcomposer.callbacks.generate import Generate
from jaxcomposer.callbacks.image_visualizer import ImageVisualizer
from jaxcomposer.callbacks.load_checkpoint import LoadCheckpoint
from jaxcomposer.callbacks.memory_monitor import MemoryMonitor
from jaxcomposer.callbacks.optimizer_monitor import OptimizerMonitor
from jaxcomposer.callbacks.monitors import LRMonitor, NaNMonitor, NonFiniteLossError, SpeedMonitor
from jaxcomposer.callbacks.runtime_estimator import RuntimeEstimator
from jaxcomposer.callbacks.stoppers import EarlyStopper, ThresholdStopper
from jaxcomposer.callbacks.system_metrics_monitor import SystemMetricsMonitor

__all__ = ["SpeedMonitor", "LRMonitor", "NaNMonitor", "NonFiniteLossError", "EarlyStopper", "ThresholdStopper",
           "MemoryMonitor", "OptimizerMonitor", "RuntimeEstimator", "SystemMetricsMonitor",
           "ExportForInferenceCallback", "FreeOutputs", "Generate", "ImageVisualizer", "LoadCheckpoint",
           "CheckpointSaver", "ActivationMonitor"]
