def main(args, action):
    # Invokes one-byte elements until the platform says no.
    taken = 0
    while taken < args.get('most', 100000):
        try:
            action.runtime.invoke('tiny', f'e{taken}', {'size': 1})
        except Exception as e:  # the refusal, with the platform's reason
            return {'taken': taken, 'refused': str(e)}
        taken += 1
    return {'taken': taken, 'refused': None}
