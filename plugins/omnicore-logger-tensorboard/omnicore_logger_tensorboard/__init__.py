"""omnicore-logger-tensorboard: the ``tensorboard`` logger (:mod:`omnicore_logger_tensorboard.logger`)."""
