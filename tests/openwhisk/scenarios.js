// Scenarios that drive scad-server through OpenWhisk's own JavaScript client (npm's `openwhisk`),
// as an OpenWhisk user's code would. Run by test_js_client.py: `node scenarios.js NAME` with
// APIHOST and AUTH from the platform's wskprops; exits non-zero with the failed assertion.
// Raw requests (fetch) only for what the client does not send (?timeout=, bad bodies, methods).
'use strict'

const assert = require('node:assert/strict')
const net = require('node:net')
const openwhisk = require('openwhisk')

const APIHOST = process.env.APIHOST || 'http://unset'
const AUTH = process.env.AUTH || 'unset:unset'
const ow = openwhisk({ apihost: APIHOST, api_key: AUTH })
const BASIC = 'Basic ' + Buffer.from(AUTH).toString('base64')

// Waits for condition() (async) to be truthy: polls every 20 ms, fails after timeoutMs.
async function until (what, condition, timeoutMs = 60000) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await condition()
    if (v) return v
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise(resolve => setTimeout(resolve, 20))
  }
}

async function raw (method, path, body, headers = {}) {
  const r = await fetch(APIHOST + path, {
    method,
    headers: { Authorization: BASIC, 'Content-Type': 'application/json', ...headers },
    body: body === undefined ? undefined : (typeof body === 'string' ? body : JSON.stringify(body))
  })
  const text = await r.text()
  let json = null
  try { json = text ? JSON.parse(text) : null } catch (e) { json = text }
  return { status: r.status, body: json, headers: r.headers }
}

// The rejection of a promise (fails if it resolves).
async function rejection (promise) {
  try {
    const v = await promise
    assert.fail('expected a rejection, got ' + JSON.stringify(v))
  } catch (e) {
    if (e instanceof assert.AssertionError) throw e
    return e
  }
}

function annotation (record, key) {
  const a = (record.annotations || []).find(x => x.key === key)
  return a === undefined ? undefined : a.value
}

function wellFormedError (body) {
  assert.equal(typeof body.error, 'string', JSON.stringify(body))
  assert.equal(typeof body.code, 'string', JSON.stringify(body))
}

// A TCP gate: an action that connects to it is running; it stays running until the gate opens.
function gate () {
  const conns = []
  let arrived
  const arrival = new Promise(resolve => { arrived = resolve })
  const server = net.createServer(c => { conns.push(c); arrived() })
  return new Promise(resolve => server.listen(0, '127.0.0.1', () => resolve({
    address: ['127.0.0.1', server.address().port],
    arrival,
    open () { conns.forEach(c => c.destroy()); server.close() }
  })))
}

const GATED = `
import socket
def main(args):
    s = socket.create_connection(tuple(args['gate']))
    s.recv(1)  # until the test closes the connection
    return {'passed': True}
`

// CRC-32 (zip's), computed here: older Node versions have no zlib.crc32.
const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1
  return c >>> 0
})
function crc32 (buf) {
  let c = 0xffffffff
  for (const b of buf) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8)
  return (c ^ 0xffffffff) >>> 0
}

// A zip of files ({name: text}), stored, as `zip -0` makes one; `claimed` overrides an entry's
// uncompressed size in the central directory (what a zip bomb declares).
function zip (files, claimed = {}) {
  const locals = []
  const centrals = []
  let offset = 0
  for (const [name, text] of Object.entries(files)) {
    const data = Buffer.from(text)
    const fname = Buffer.from(name)
    const crc = crc32(data)
    const local = Buffer.alloc(30)
    local.writeUInt32LE(0x04034b50, 0)
    local.writeUInt16LE(20, 4)
    local.writeUInt16LE(0x21, 12)  // 1980-01-01
    local.writeUInt32LE(crc, 14)
    local.writeUInt32LE(data.length, 18)
    local.writeUInt32LE(data.length, 22)
    local.writeUInt16LE(fname.length, 26)
    const central = Buffer.alloc(46)
    central.writeUInt32LE(0x02014b50, 0)
    central.writeUInt16LE(0x0314, 4)  // made on Unix: the mode is in the external attributes
    central.writeUInt16LE(20, 6)
    central.writeUInt16LE(0x21, 14)
    central.writeUInt32LE(crc, 16)
    central.writeUInt32LE(data.length, 20)
    central.writeUInt32LE(claimed[name] ?? data.length, 24)
    central.writeUInt16LE(fname.length, 28)
    central.writeUInt32LE((0o100644 << 16) >>> 0, 38)
    central.writeUInt32LE(offset, 42)
    locals.push(local, fname, data)
    centrals.push(central, fname)
    offset += 30 + fname.length + data.length
  }
  const directory = Buffer.concat(centrals)
  const end = Buffer.alloc(22)
  end.writeUInt32LE(0x06054b50, 0)
  end.writeUInt16LE(Object.keys(files).length, 8)
  end.writeUInt16LE(Object.keys(files).length, 10)
  end.writeUInt32LE(directory.length, 12)
  end.writeUInt32LE(offset, 16)
  return Buffer.concat([...locals, directory, end])
}

async function python (name, code, extra = {}) {
  return ow.actions.create({ name, action: code, kind: 'python:3', overwrite: true, ...extra })
}

const scenarios = {
  async actions_crud () {
    const created = await ow.actions.create({ name: 'crud', action: "def main(a):\n    return {'x': a.get('x', 0)}\n", kind: 'python:3' })
    assert.equal(created.version, '0.0.1')
    assert.equal(created.exec.kind, 'python:3')
    assert.equal(created.exec.code, undefined)
    const again = await rejection(ow.actions.create({ name: 'crud', action: 'x', kind: 'python:3' }))
    assert.equal(again.statusCode, 409)
    const got = await ow.actions.get('crud')
    assert.match(got.exec.code, /def main/)
    assert.ok((await ow.actions.list()).some(a => a.name === 'crud'))
    // `wsk action update -p x 5` sends only parameters: the code stays.
    const withParam = await ow.actions.update({ name: 'crud', params: { x: 5 } })
    assert.equal(withParam.version, '0.0.2')
    assert.deepEqual(await ow.actions.invoke({ name: 'crud', blocking: true, result: true }), { x: 5 })
    // `--timeout` sends only that limit: the others stay as they were.
    await ow.actions.update({ name: 'crud', limits: { memory: 200 } })
    const timed = await ow.actions.update({ name: 'crud', limits: { timeout: 5000 } })
    assert.equal(timed.limits.timeout, 5000)
    assert.equal(timed.limits.memory, 200)
    assert.deepEqual(timed.parameters, [{ key: 'x', value: 5 }])
    assert.deepEqual(await ow.actions.invoke({ name: 'crud', blocking: true, result: true, params: { x: 7 } }), { x: 7 })
    await ow.actions.delete('crud')
    const gone = await rejection(ow.actions.get('crud'))
    assert.equal(gone.statusCode, 404)
    wellFormedError(gone.error)
    const missing = await rejection(ow.actions.update({ name: 'nothing-here', params: { x: 1 } }))
    assert.equal(missing.statusCode, 400)  // an update of nothing has no exec
  },

  async limits () {
    const cases = [[{ timeout: 400000 }, /duration 400000 milliseconds exceeds allowed threshold of 300000 milliseconds/],
      [{ timeout: 50 }, /duration 50 milliseconds below allowed threshold of 100 milliseconds/],
      [{ memory: 1024 }, /memory 1024 MB exceeds allowed threshold of 512 MB/],
      [{ logs: 11 }, /log size 11 MB exceeds allowed threshold of 10 MB/],
      [{ concurrency: 2 }, /concurrency 2 exceeds allowed threshold of 1/],
      [{ timeout: 'soon' }, /'timeout' must be an integer/]]
    for (const [limits, message] of cases) {
      const e = await rejection(python('limited', 'def main(a): return a', { limits }))
      assert.equal(e.statusCode, 400, JSON.stringify(limits))
      assert.match(e.message, message)
      wellFormedError(e.error)
    }
    const ok = await python('limited', 'def main(a): return a', { limits: { timeout: 100, memory: 128, logs: 0 } })
    assert.deepEqual(ok.limits, { timeout: 100, memory: 128, logs: 0, concurrency: 1 })
    const e = await rejection(ow.actions.create({ name: 'js', action: 'function main(){}', kind: 'nodejs:20' }))
    assert.equal(e.statusCode, 400)
    assert.match(e.message, /runtime 'nodejs:20' is not supported/)
  },

  async error_semantics () {
    await python('fails', "def main(a):\n    return {'error': 'it went wrong'}\n")
    let e = await rejection(ow.actions.invoke({ name: 'fails', blocking: true }))
    assert.equal(e.statusCode, 502)
    assert.match(e.message, /it went wrong/)
    assert.equal(e.error.response.status, 'application error')
    assert.equal(e.error.response.success, false)
    assert.deepEqual(e.error.response.result, { error: 'it went wrong' })

    await python('raises', "def main(a):\n    return 1 / 0\n")
    e = await rejection(ow.actions.invoke({ name: 'raises', blocking: true }))
    assert.equal(e.statusCode, 502)
    assert.equal(e.error.response.status, 'application error')
    assert.equal(typeof e.error.response.result.error, 'string')
    assert.match(e.message, /division by zero/)
    assert.doesNotMatch(e.message, /Response Missing Error Message/)
    const logs = await ow.activations.logs(e.error.activationId)
    assert.ok(logs.logs.some(l => /ZeroDivisionError/.test(l)), JSON.stringify(logs))

    await python('array', "def main(a):\n    return [1, {'two': 2}]\n")
    assert.deepEqual(await ow.actions.invoke({ name: 'array', blocking: true, result: true }), [1, { two: 2 }])
    await python('scalar', "def main(a):\n    return 42\n")
    e = await rejection(ow.actions.invoke({ name: 'scalar', blocking: true }))
    assert.equal(e.statusCode, 502)
    assert.match(e.message, /did not return a dictionary or array/)

    // The result limit: 1 MiB, as OpenWhisk's; the error names the size.
    await python('big', "def main(a):\n    return {'blob': 'x' * (2 << 20)}\n")
    e = await rejection(ow.actions.invoke({ name: 'big', blocking: true }))
    assert.equal(e.statusCode, 502)
    assert.match(e.message, /exceeded the allowed length: \d+ > 1048576 bytes/)

    // A timeout is the developer's error, annotated as OpenWhisk does.
    await python('slow', "import time\ndef main(a):\n    time.sleep(5)\n    return {}\n", { limits: { timeout: 300 } })
    e = await rejection(ow.actions.invoke({ name: 'slow', blocking: true }))
    assert.equal(e.error.response.status, 'action developer error')
    assert.match(e.message, /exceeded its time limits of 300 milliseconds/)
    assert.equal(annotation(e.error, 'timeout'), true)

    // The list tells each status by its code.
    const listed = await ow.activations.list({ limit: 50 })
    const code = name => listed.find(a => a.name === name).statusCode
    assert.equal(code('fails'), 1)
    assert.equal(code('array'), 0)
    assert.equal(code('slow'), 2)
  },

  async records () {
    await python('rec', "def main(a):\n    print('to stdout')\n    import sys\n    print('to stderr', file=sys.stderr)\n    return {'n': a['n']}\n")
    const first = await ow.actions.invoke({ name: 'rec', blocking: true, params: { n: 1 } })
    const second = await ow.actions.invoke({ name: 'rec', blocking: true, params: { n: 2 } })
    for (const r of [first, second]) {
      assert.match(r.version, /^\d+\.\d+\.\d+$/)
      assert.equal(r.publish, false)
      assert.equal(annotation(r, 'path'), r.namespace + '/rec')
      assert.equal(annotation(r, 'kind'), 'python:3')
      assert.deepEqual(annotation(r, 'limits'), { timeout: 60000, memory: 256, logs: 10, concurrency: 1 })
      assert.equal(typeof annotation(r, 'waitTime'), 'number')
      assert.equal(typeof r.response.size, 'number')
      assert.ok(r.logs.some(l => / stdout: to stdout$/.test(l)), JSON.stringify(r.logs))
      assert.ok(r.logs.some(l => / stderr: to stderr$/.test(l)), JSON.stringify(r.logs))
    }
    assert.equal(typeof annotation(first, 'initTime'), 'number')  // a process had to load the code
    assert.equal(annotation(second, 'initTime'), undefined)       // a warm one did not
    const got = await ow.activations.get(second.activationId)
    assert.deepEqual(got.response.result, { n: 2 })
    assert.deepEqual((await ow.activations.result(second.activationId)).result, { n: 2 })
  },

  async activation_list () {
    await python('listed', 'def main(a): return a')
    await python('other', 'def main(a): return a')
    const before = Date.now()
    const ids = []
    for (let i = 0; i < 3; i++) ids.push((await ow.actions.invoke({ name: 'listed', blocking: true, params: { i } })).activationId)
    await ow.actions.invoke({ name: 'other', blocking: true })
    const entries = await ow.activations.list({ name: 'listed', limit: 10 })
    assert.deepEqual(entries.map(a => a.activationId), ids.slice().reverse())  // newest first
    for (const a of entries) {
      assert.equal(a.statusCode, 0)
      assert.equal(a.response, undefined)  // OpenWhisk's short form
      assert.equal(a.logs, undefined)
      assert.equal(typeof a.duration, 'number')
    }
    assert.deepEqual(await ow.activations.list({ name: 'listed', count: true }), { activations: 3 })
    assert.deepEqual((await ow.activations.list({ name: 'listed', skip: 1, limit: 1 })).map(a => a.activationId), [ids[1]])
    const docs = await ow.activations.list({ name: 'listed', docs: true, limit: 1 })
    assert.deepEqual(docs[0].response.result, { i: 2 })
    const since = await ow.activations.list({ since: before, limit: 200 })
    assert.equal(since.length, 4)
    const upto = await ow.activations.list({ name: 'listed', upto: before - 1 })
    assert.equal(upto.length, 0)
    const e = await rejection(ow.activations.list({ limit: 201 }))
    assert.equal(e.statusCode, 400)
    assert.match(e.message, /not in the range of 0 to 200/)
    assert.equal((await rejection(ow.activations.list({ count: true, docs: true }))).statusCode, 400)
  },

  async running_activation () {
    await python('gated', GATED)
    const g = await gate()
    const { activationId } = await ow.actions.invoke({ name: 'gated', params: { gate: g.address } })
    await g.arrival  // it runs now
    const e = await rejection(ow.activations.get(activationId))
    assert.equal(e.statusCode, 404)  // as OpenWhisk: not there until it is done
    assert.ok(!(await ow.activations.list({ name: 'gated' })).some(a => a.activationId === activationId))
    g.open()
    const done = await until('the activation to be recorded', () => ow.activations.get(activationId).catch(() => null))
    assert.deepEqual(done.response.result, { passed: true })
  },

  async blocking_timeout () {
    await python('gated', GATED)
    const g = await gate()
    const r = await raw('POST', '/api/v1/namespaces/_/actions/gated?blocking=true&timeout=200', { gate: g.address })
    assert.equal(r.status, 202)  // the wait ended first: the client polls the id
    assert.match(r.body.activationId, /^[0-9a-f]{32}$/)
    g.open()
    await until('the activation to finish', () => ow.activations.get(r.body.activationId).catch(() => null))
    for (const t of ['0', '70000', 'soon']) {
      const bad = await raw('POST', `/api/v1/namespaces/_/actions/gated?blocking=true&timeout=${t}`, {})
      assert.equal(bad.status, 400, t)
      assert.match(bad.body.error, /Timeout must be number of milliseconds up to 60000/)
    }
  },

  async bad_requests () {
    await python('echo', 'def main(a): return a')
    for (const body of ['[1, 2]', '"text"', '{not json']) {
      const r = await raw('POST', '/api/v1/namespaces/_/actions/echo?blocking=true', body)
      assert.equal(r.status, 400, body)
      wellFormedError(r.body)
    }
    const unknown = await raw('GET', '/api/v1/no/such/route')
    assert.equal(unknown.status, 404)
    wellFormedError(unknown.body)
    const patch = await raw('PATCH', '/api/v1/namespaces/_/actions/echo', {})
    assert.equal(patch.status, 405)
    wellFormedError(patch.body)
    assert.match(patch.headers.get('allow'), /PUT/)
  },

  async zip_actions () {
    // What `zip -r action.zip __main__.py helper.py data/` gives; the client sends a Buffer as
    // base64 without the binary flag, as wsk does with --kind python:3.
    const files = {
      '__main__.py': "import os\nfrom helper import shout\ndef main(a):\n    global runs\n    runs = globals().get('runs', 0) + 1\n" +
        "    return {'said': shout(a.get('w', 'hi')), 'data': open('data/words.txt').read(), 'runs': runs}\n",
      'helper.py': "def shout(w):\n    return w.upper() + '!'\n",
      'data/words.txt': 'bundled'
    }
    const code = zip(files)
    const created = await ow.actions.create({ name: 'zipped', action: code, kind: 'python:3', overwrite: true })
    assert.equal(created.exec.binary, true)
    const first = await ow.actions.invoke({ name: 'zipped', blocking: true, params: { w: 'zip' } })
    assert.deepEqual(first.response.result, { said: 'ZIP!', data: 'bundled', runs: 1 })
    assert.equal(typeof annotation(first, 'initTime'), 'number')
    // Warm: the same process, its module and globals kept, nothing unpacked again.
    const second = await ow.actions.invoke({ name: 'zipped', blocking: true, params: { w: 'again' } })
    assert.deepEqual(second.response.result, { said: 'AGAIN!', data: 'bundled', runs: 2 })
    assert.equal(annotation(second, 'initTime'), undefined)
    // Read back as OpenWhisk gives it: base64, flagged binary.
    const got = await ow.actions.get('zipped')
    assert.equal(got.exec.binary, true)
    assert.equal(got.exec.code, code.toString('base64'))
    assert.equal((await ow.actions.get({ name: 'zipped', code: false })).exec.code, undefined)
    // An update of parameters only keeps the zip.
    await ow.actions.update({ name: 'zipped', params: { w: 'kept' } })
    assert.equal((await ow.actions.invoke({ name: 'zipped', blocking: true, result: true })).said, 'KEPT!')
    // exec.main names another function; `exec` is the other name the runtimes take for __main__.py.
    await ow.actions.create({ name: 'zipped-go', action: zip({ exec: "def go(a):\n    return {'went': True}\n" }), kind: 'python:3', exec: { main: 'go' }, overwrite: true })
    assert.deepEqual(await ow.actions.invoke({ name: 'zipped-go', blocking: true, result: true }), { went: true })
    // Flagged binary by hand, as wsk sends a .zip.
    const flagged = await raw('PUT', '/api/v1/namespaces/_/actions/zipped-flag?overwrite=true',
      { exec: { kind: 'python:3', code: code.toString('base64'), binary: true } })
    assert.equal(flagged.status, 200)
    assert.equal((await ow.actions.invoke({ name: 'zipped-flag', blocking: true, result: true })).data, 'bundled')
  },

  async zip_errors () {
    // What the controller can tell: not base64, not a zip (400).
    let e = await rejection(ow.actions.create({ name: 'badzip', action: { exec: { kind: 'python:3', code: 'def main(a): return a', binary: true } } }))
    assert.equal(e.statusCode, 400)
    assert.match(e.message, /must be a zip file in base64: it is not base64/)
    wellFormedError(e.error)
    e = await rejection(ow.actions.create({ name: 'badzip', action: Buffer.from('PK\x03\x04 but nothing more'), kind: 'python:3' }))
    assert.equal(e.statusCode, 400)
    assert.match(e.message, /must be a zip file in base64: it is not a zip file/)
    // What only unpacking tells: the activation fails as the runtime's init does, the reason in its logs.
    const broken = [
      ['zip-nomain', zip({ 'main.py': 'def main(a): return a' }), {}, /Zip file does not include '__main__.py'/],
      ['zip-slip', zip({ '__main__.py': 'def main(a): return a', '../escape.py': 'x = 1' }), {}, /entry outside its folder: '..\/escape.py'/],
      ['zip-absolute', zip({ '__main__.py': 'def main(a): return a', '/etc/evil.py': 'x = 1' }), {}, /entry outside its folder: '\/etc\/evil.py'/],
      ['zip-bomb', zip({ '__main__.py': 'def main(a): return a', 'big.bin': 'x' }, { 'big.bin': 300 << 20 }), {}, /unpacks to more than 268435456 bytes/],
      ['zip-broken-import', zip({ '__main__.py': 'import not_in_the_zip\ndef main(a): return a' }), {}, /ModuleNotFoundError: No module named 'not_in_the_zip'/],
      ['zip-syntax', zip({ '__main__.py': 'def main(a:\n' }), {}, /SyntaxError/]
    ]
    for (const [name, code, extra, reason] of broken) {
      await ow.actions.create({ name, action: code, kind: 'python:3', overwrite: true, ...extra })
      for (let i = 0; i < 2; i++) {  // the second one too: a failed init leaves nothing behind
        e = await rejection(ow.actions.invoke({ name, blocking: true }))
        assert.equal(e.statusCode, 502, name)
        assert.equal(e.error.response.status, 'action developer error', name)
        const message = name === 'zip-syntax' ? 'The action failed to generate or locate a binary. See logs for details.'
          : 'Cannot start action. Check logs for details.'
        assert.deepEqual(e.error.response.result, { error: message }, name)
        assert.ok(e.error.logs.some(l => reason.test(l)), `${name}: ${JSON.stringify(e.error.logs)}`)
      }
    }
    // The limit on exec: OpenWhisk's 48 MB, a 413.
    const big = await raw('PUT', '/api/v1/namespaces/_/actions/too-big', { exec: { kind: 'python:3', code: '#'.repeat((48 << 20) + 1) } })
    assert.equal(big.status, 413)
    assert.match(big.body.error, /^exec larger than allowed: 50331653 > 50331648 bytes\.$/)
  },

  async list_paging () {
    for (const name of ['page-a', 'page-b', 'page-c']) {
      await python(name, 'def main(a): return a')
      await new Promise(resolve => setTimeout(resolve, 5))  // each its own update time
    }
    // Most recently updated first, as OpenWhisk lists them.
    assert.deepEqual((await ow.actions.list({ limit: 3 })).map(a => a.name), ['page-c', 'page-b', 'page-a'])
    assert.deepEqual((await ow.actions.list({ limit: 2, skip: 1 })).map(a => a.name), ['page-b', 'page-a'])
    const all = await ow.actions.list({ limit: 0 })  // 0: as many as a page holds (200)
    assert.ok(all.length >= 3 && all.every(a => a.exec.code === undefined))
    assert.deepEqual(await ow.actions.list({ count: true }), { actions: all.length })
    assert.deepEqual(await ow.actions.list({ count: true, skip: 2 }), { actions: all.length - 2 })
    assert.ok((await ow.actions.list()).length <= 30)  // the default limit
    for (const name of ['shelf-a', 'shelf-b']) {
      await ow.packages.create({ name })
      await ow.triggers.create({ name })
      await ow.rules.create({ name, action: 'page-a', trigger: name })
      await new Promise(resolve => setTimeout(resolve, 5))
    }
    for (const kind of ['packages', 'triggers', 'rules']) {
      const one = await ow[kind].list({ limit: 1 })
      assert.equal(one.length, 1, kind)
      assert.equal(one[0].name, 'shelf-b', kind)
      assert.equal((await ow[kind].list({ limit: 1, skip: 1 }))[0].name, 'shelf-a', kind)
      const cases = [['limit=201', /^The value '201' is not in the range of 0 to 200 for /],
        ['limit=many', /^The value 'many' is not an integer for /],
        ['skip=-1', /^The value '-1' is not greater than or equal to 0 for /],
        ['skip=1.5', /^The value '1.5' is not an integer for /]]
      for (const [query, message] of cases) {
        const r = await raw('GET', `/api/v1/namespaces/_/${kind}?${query}`)
        assert.equal(r.status, 400, `${kind}?${query}`)
        assert.match(r.body.error, message)
        assert.ok(r.body.error.endsWith(` for ${kind}.`), r.body.error)
        wellFormedError(r.body)
      }
    }
    const r = await raw('GET', '/api/v1/namespaces/_/actions?limit=99999999999')
    assert.equal(r.status, 400)
    assert.equal(r.body.error, "The value '99999999999' is not an integer for actions.")
  },

  async environment () {
    const code = "import os\ndef main(a):\n    return {k: v for k, v in os.environ.items() if k.startswith('__OW_')}\n"
    await python('env', code)
    const r = await ow.actions.invoke({ name: 'env', blocking: true })
    const env = r.response.result
    assert.equal(env.__OW_ACTIVATION_ID, r.activationId)
    assert.equal(env.__OW_ACTION_NAME, `/${r.namespace}/env`)
    assert.equal(env.__OW_NAMESPACE, r.namespace)
    assert.equal(env.__OW_ACTION_VERSION, r.version)
    assert.equal(env.__OW_API_HOST, APIHOST)
    assert.match(env.__OW_TRANSACTION_ID, /^[0-9a-f]+$/)
    const deadline = Number(env.__OW_DEADLINE)
    assert.ok(deadline > r.start && deadline <= r.start + 60000 + 1000, `${deadline} vs ${r.start}`)
    assert.equal(env.__OW_API_KEY, undefined)  // not asked for
    assert.ok(!JSON.stringify(r.logs).includes(AUTH.split(':')[1]))
    // Asked for: the caller's key, with which the action reaches the API itself.
    const calls = `import base64, json, os, urllib.request
def main(a):
    req = urllib.request.Request(os.environ['__OW_API_HOST'] + '/api/v1/namespaces')
    req.add_header('Authorization', 'Basic ' + base64.b64encode(os.environ['__OW_API_KEY'].encode()).decode())
    return {'namespaces': json.load(urllib.request.urlopen(req, timeout=30))}
`
    await python('caller', calls, { annotations: { 'provide-api-key': true } })
    const called = await ow.actions.invoke({ name: 'caller', blocking: true, result: true })
    assert.deepEqual(called.namespaces, [r.namespace])
    // The warm process runs the next activation without the previous one's variables.
    const again = await ow.actions.invoke({ name: 'env', blocking: true })
    assert.notEqual(again.response.result.__OW_ACTIVATION_ID, r.activationId)
    assert.equal(again.response.result.__OW_API_KEY, undefined)
  },

  async packages () {
    await ow.packages.create({ name: 'tools', package: { parameters: [{ key: 'a', value: 'pkg' }, { key: 'b', value: 'pkg' }, { key: 'c', value: 'pkg' }] } })
    await ow.actions.create({ name: 'tools/merge', action: 'def main(a): return a', kind: 'python:3', params: { b: 'action', c: 'action' } })
    const result = await ow.actions.invoke({ name: 'tools/merge', blocking: true, result: true, params: { c: 'call' } })
    assert.deepEqual(result, { a: 'pkg', b: 'action', c: 'call' })
    const rec = await ow.actions.invoke({ name: 'tools/merge', blocking: true })
    assert.equal(rec.name, 'merge')
    assert.equal(annotation(rec, 'path'), `${rec.namespace}/tools/merge`)
    assert.equal((await ow.activations.list({ name: 'tools/merge', count: true })).activations, 2)
    const pkg = await ow.packages.get('tools')
    assert.deepEqual(pkg.actions.map(a => a.name), ['merge'])
    const got = await ow.actions.get('tools/merge')
    assert.equal(got.namespace, `${rec.namespace}/tools`)
    const e = await rejection(ow.packages.delete('tools'))
    assert.equal(e.statusCode, 409)
    assert.match(e.message, /Package not empty/)
    const unbound = await rejection(ow.actions.create({ name: 'nopkg/x', action: 'def main(a): return a', kind: 'python:3' }))
    assert.equal(unbound.statusCode, 404)
    await ow.actions.delete('tools/merge')
    await ow.packages.delete('tools')
    assert.equal((await rejection(ow.packages.get('tools'))).statusCode, 404)
  },

  async sequences () {
    await python('inc', "def main(a):\n    return {'n': a.get('n', 0) + 1}\n")
    await python('dbl', "def main(a):\n    return {'n': a['n'] * 2}\n")
    await ow.actions.create({ name: 'incdbl', sequence: ['/_/inc', '/_/dbl', '/_/inc'], overwrite: true })
    const rec = await ow.actions.invoke({ name: 'incdbl', blocking: true, params: { n: 4 } })
    assert.deepEqual(rec.response.result, { n: 11 })
    assert.equal(annotation(rec, 'kind'), 'sequence')
    assert.equal(annotation(rec, 'topmost'), true)
    assert.equal(rec.logs.length, 3)  // the components' activation ids, as OpenWhisk
    for (const id of rec.logs) {
      const c = await ow.activations.get(id)
      assert.equal(c.cause, rec.activationId)
      assert.equal(annotation(c, 'causedBy'), 'sequence')
    }
    // A failing component ends the sequence with its error.
    await python('boom', "def main(a):\n    raise ValueError('boom')\n")
    await ow.actions.create({ name: 'failing', sequence: ['inc', 'boom', 'dbl'], overwrite: true })
    const e = await rejection(ow.actions.invoke({ name: 'failing', blocking: true }))
    assert.equal(e.statusCode, 502)
    assert.match(e.message, /boom/)
    assert.equal(e.error.logs.length, 2)
    let bad = await rejection(ow.actions.create({ name: 'broken', sequence: ['/_/missing'] }))
    assert.equal(bad.statusCode, 400)
    assert.match(bad.message, /Sequence component does not exist/)
    bad = await rejection(ow.actions.update({ name: 'incdbl', sequence: ['/_/incdbl'] }))
    assert.match(bad.message, /Sequence may not refer to itself/)
  },

  async triggers_and_rules () {
    await python('hear', 'def main(a): return a')
    await ow.triggers.create({ name: 'bell', trigger: { parameters: [{ key: 'from', value: 'trigger' }] } })
    await ow.rules.create({ name: 'ring', action: 'hear', trigger: 'bell' })
    const rule = await ow.rules.get('ring')
    assert.equal(rule.status, 'active')
    const trig = await ow.triggers.get('bell')
    assert.equal(Object.keys(trig.rules).length, 1)
    const fired = await ow.triggers.invoke({ name: 'bell', params: { payload: 42 } })
    const record = await until('the trigger activation', () => ow.activations.get(fired.activationId).catch(() => null))
    assert.equal(record.name, 'bell')
    assert.equal(record.logs.length, 1)
    const line = JSON.parse(record.logs[0])
    assert.equal(line.success, true)
    assert.match(line.rule, /\/ring$/)
    const ran = await until('the rule\'s action', () => ow.activations.get(line.activationId).catch(() => null))
    assert.deepEqual(ran.response.result, { from: 'trigger', payload: 42 })
    assert.equal(ran.cause, fired.activationId)
    await ow.rules.disable({ name: 'ring' })
    assert.equal((await ow.rules.get('ring')).status, 'inactive')
    const r = await raw('POST', '/api/v1/namespaces/_/triggers/bell', { payload: 1 })
    assert.equal(r.status, 204)  // no active rule: nothing runs, nothing is recorded
    await ow.rules.enable({ name: 'ring' })
    const bad = await rejection(ow.rules.create({ name: 'nowhere', action: 'hear', trigger: 'no-such-trigger' }))
    assert.equal(bad.statusCode, 404)
    await ow.rules.delete('ring')
    await ow.triggers.delete('bell')
    assert.equal((await rejection(ow.triggers.get('bell'))).statusCode, 404)
  },

  async web_actions () {
    await python('web', "def main(a):\n    return {'got': a.get('x'), 'method': a['__ow_method']}\n", { annotations: { 'web-export': true } })
    await python('private', 'def main(a): return a')
    const ns = (await ow.namespaces.list())[0]
    let r = await fetch(`${APIHOST}/api/v1/web/${ns}/default/web.json?x=1`)
    assert.equal(r.status, 200)
    assert.deepEqual(await r.json(), { got: '1', method: 'get' })
    r = await fetch(`${APIHOST}/api/v1/web/${ns}/default/web.json`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"x": 2}' })
    assert.deepEqual(await r.json(), { got: 2, method: 'post' })
    r = await fetch(`${APIHOST}/api/v1/web/${ns}/default/private.json`)
    assert.equal(r.status, 404)  // not exported
    wellFormedError(await r.json())
    await python('page', "def main(a):\n    return {'statusCode': 201, 'headers': {'content-type': 'text/plain'}, 'body': 'made'}\n", { annotations: { 'web-export': true } })
    r = await fetch(`${APIHOST}/api/v1/web/${ns}/default/page.http`)
    assert.equal(r.status, 201)
    assert.equal(await r.text(), 'made')
  }
}

const name = process.argv[2]
if (name === '--list') {
  console.log(Object.keys(scenarios).join('\n'))
} else if (!scenarios[name]) {
  console.error(`unknown scenario ${name}; known: ${Object.keys(scenarios).join(', ')}`)
  process.exit(2)
} else {
  scenarios[name]().then(() => console.log(`ok ${name}`), e => {
    console.error(e && e.stack ? e.stack : e)
    process.exit(1)
  })
}
