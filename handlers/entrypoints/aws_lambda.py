"""AWS Lambda entry point: `handlers.entrypoints.aws_lambda.handler`.

Importing this module IS Lambda's init phase: the manifest is read and every model loaded and
warmed up here, once per execution environment (never in ASGI lifespan, which Mangum runs on every
invocation). See lambda_handler.py for events, batching and payload limits.
"""

from .lambda_handler import LambdaHandler

handler = LambdaHandler.from_environment()
