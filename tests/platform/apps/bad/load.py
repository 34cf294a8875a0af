def main(args, action): return {}
