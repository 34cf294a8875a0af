"""Joins the partial sums and checks them against the closed form."""


def main(args, action):
    parts = args["partial"]                          # one result per instance of `partial`
    n = sum(p["count"] for p in parts)
    total = sum(p["sum_sq"] for p in parts)
    full, rest = divmod(n, 1000)
    expected = full * sum(float(k * k) for k in range(1000)) + sum(float(k * k) for k in range(rest))
    return {"n": n, "sum_of_squares": total, "instances": len(parts), "verified": total == expected}
