"""omnicore-logger-wandb: the ``wandb`` logger (:mod:`omnicore_logger_wandb.logger`)."""
