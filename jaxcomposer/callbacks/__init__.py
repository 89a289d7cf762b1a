"""Host callbacks (Composer's ``composer.callbacks``): monitors and stoppers."""
from jaxcomposer.callbacks.memory_monitor import MemoryMonitor
from jaxcomposer.callbacks.optimizer_monitor import OptimizerMonitor
from jaxcomposer.callbacks.monitors import LRMonitor, NaNMonitor, NonFiniteLossError, SpeedMonitor
from jaxcomposer.callbacks.runtime_estimator import RuntimeEstimator
from jaxcomposer.callbacks.stoppers import EarlyStopper, ThresholdStopper
from jaxcomposer.callbacks.system_metrics_monitor import SystemMetricsMonitor

__all__ = ["SpeedMonitor", "LRMonitor", "NaNMonitor", "NonFiniteLossError", "EarlyStopper", "ThresholdStopper",
           "MemoryMonitor", "OptimizerMonitor", "RuntimeEstimator", "SystemMetricsMonitor"]
