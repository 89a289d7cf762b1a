"""Logger facade and destinations (Composer's ``composer.loggers``). Optional backends import their package lazily."""
from jaxcomposer.loggers.console import ConsoleLogger
from jaxcomposer.loggers.file import FileLogger
from jaxcomposer.loggers.in_memory import InMemoryLogger
from jaxcomposer.loggers.jsonl import JSONLLogger, read_jsonl
from jaxcomposer.loggers.logger import Logger, LoggerDestination
from jaxcomposer.loggers.mlflow import MLFlowLogger
from jaxcomposer.loggers.plot import LivePlotLogger, PlotLogger
from jaxcomposer.loggers.progress_bar import ProgressBarLogger
from jaxcomposer.loggers.remote_uploader_downloader import RemoteUploaderDownloader
from jaxcomposer.loggers.tensorboard import TensorboardLogger
from jaxcomposer.loggers.wandb import WandBLogger

__all__ = [
    "Logger", "LoggerDestination", "ConsoleLogger", "FileLogger", "InMemoryLogger", "JSONLLogger", "read_jsonl",
    "LivePlotLogger", "PlotLogger", "ProgressBarLogger", "RemoteUploaderDownloader", "TensorboardLogger",
    "MLFlowLogger", "WandBLogger",
]
