"""Google Cloud Run deployment.

- artifact_registry: the Docker repository in Artifact Registry and the image push
- admin_api: Cloud Run Admin API v1 (namespaces.services get / create / replaceService, IAM policy),
  the API behind `gcloud run services replace`, through a google-auth session
- deploy: push, apply the rendered service.yaml, wait for the revision, print the URL

google-auth and requests are imported only inside these code paths (the `cloudrun` extra).
"""
