"""AWS Lambda deployment (`lambda` is a Python keyword, hence the package name).

- settings: the function's memory, timeout, storage, architecture and URL auth, with Lambda's quotas
- ecr: the ECR repository, the image push (container engine, or ECR's layer API for image archives)
- iam: the least-privilege execution role (CloudWatch Logs of this function only)
- function: create or update the function, publish a version, move alias `live`, the Function URL
  and its resource policy, provisioned concurrency
- deploy: the whole sequence, its dry-run plan and the deploy record

boto3 is imported only inside these deploy code paths (the `lambda` extra).
"""
