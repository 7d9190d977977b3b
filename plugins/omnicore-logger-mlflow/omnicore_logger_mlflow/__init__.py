"""omnicore-logger-mlflow: the ``mlflow`` logger (:mod:`omnicore_logger_mlflow.logger`)."""
