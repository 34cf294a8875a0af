def main(args, action): return {"ran": True}
