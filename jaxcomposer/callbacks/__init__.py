"""Host callbacks (Composer's ``composer.callbacks``): monitors and stoppers."""
from jaxcomposer.callbacks.monitors import LRMonitor, NaNMonitor, NonFiniteLossError, SpeedMonitor
from jaxcomposer.callbacks.stoppers import EarlyStopper, ThresholdStopper

__all__ = ["SpeedMonitor", "LRMonitor", "NaNMonitor", "NonFiniteLossError", "EarlyStopper", "ThresholdStopper"]
