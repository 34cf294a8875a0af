def main(args, action):
    # Hands its runtime credentials to the next stage, which tries them once this one is over.
    return {"token": action.runtime_token, "aid": action.id, "url": action.runtime_url}
