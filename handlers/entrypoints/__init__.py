"""Process entry points: uvicorn (Cloud Run, Knative, `toolkit serve`) and Lambda (Mangum)."""
