// An ACP client built on the official TypeScript SDK (@agentclientprotocol/sdk, `client()`),
// driving `agent-supervisor acp` for tests/clients/test_acp_front.py. Not our code on the client side:
// the SDK frames, validates (zod) and routes every message.
//
//   node ts_client.mjs SDK_ENTRY SCENARIO AGENT_ARGV_JSON [CWD]
//
// Prints one JSON line: what the scenario saw. Every wait is bounded by the caller's timeout.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { Readable, Writable } from "node:stream";

const [sdkEntry, scenario, argvJson, cwdArg] = process.argv.slice(2);
const acp = await import(sdkEntry);
const { client, methods, ndJsonStream } = acp;
const cwd = cwdArg || process.cwd();

function startAgent(argv) {
  const child = spawn(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  const stream = ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  return { child, stream };
}

// What the client has seen of each session, and hooks a scenario waits on.
function makeApp(state) {
  const app = client({ name: "acp-front-test" });
  app.onNotification(methods.client.session.update, (ctx) => {
    const update = ctx.params.update;
    state.updates.push(update);
    for (const waiter of state.waiters.splice(0)) waiter(update);
  });
  app.onRequest(methods.client.session.requestPermission, async (ctx) => {
    state.permissions.push(ctx.params);
    if (state.answerPermissions) {
      const allow = ctx.params.options.find((o) => o.kind.startsWith("allow"));
      return { outcome: { outcome: "selected", optionId: allow.optionId } };
    }
    // Hold it: a session/cancel must make the agent withdraw it ($/cancel_request).
    state.onPermission?.();
    await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
    state.withdrawn += 1;
    return { outcome: { outcome: "cancelled" } };
  });
  return app;
}

function newState() {
  return { updates: [], waiters: [], permissions: [], answerPermissions: true, withdrawn: 0 };
}

function nextUpdate(state, predicate) {
  const found = state.updates.find(predicate);
  if (found) return Promise.resolve(found);
  return new Promise((resolve) => {
    const waiter = (update) => (predicate(update) ? resolve(update) : state.waiters.push(waiter));
    state.waiters.push(waiter);
  });
}

const text = (t) => [{ type: "text", text: t }];
const messageText = (updates) =>
  updates
    .filter((u) => u.sessionUpdate === "agent_message_chunk" && !u._meta?.agentSupervisor)
    .map((u) => u.content.text)
    .join("");
const notices = (updates) =>
  updates.filter((u) => u._meta?.agentSupervisor?.notice).map((u) => u._meta.agentSupervisor.notice);

async function withAgent(argv, state, op) {
  const { child, stream } = startAgent(argv);
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  try {
    return await makeApp(state).connectWith(stream, op);
  } finally {
    child.stdin.end();
    state.exitCode = await exited;
  }
}

async function open(ctx) {
  const init = await ctx.request(methods.agent.initialize, {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
    clientInfo: { name: "acp-front-test", version: "1" },
  });
  const session = await ctx.request(methods.agent.session.new, { cwd, mcpServers: [] });
  return { init, session };
}

async function prompt(ctx, sessionId, words) {
  return ctx.request(methods.agent.session.prompt, { sessionId, prompt: text(words) });
}

const scenarios = {
  async basic(argv) {
    const state = newState();
    return withAgent(argv, state, async (ctx) => {
      const { init, session } = await open(ctx);
      const answer = await prompt(ctx, session.sessionId, "hello words=6 fast");
      return {
        init,
        session,
        stopReason: answer.stopReason,
        kinds: [...new Set(state.updates.map((u) => u.sessionUpdate))],
        text: messageText(state.updates),
      };
    });
  },

  // Switch to demo-stubborn by the config option, cancel a turn it ignores, prompt again.
  async stubborn(argv) {
    const state = newState();
    return withAgent(argv, state, async (ctx) => {
      const { session } = await open(ctx);
      const sessionId = session.sessionId;
      const switched = await ctx.request(methods.agent.session.setConfigOption, {
        sessionId,
        configId: "agent",
        value: "demo-stubborn",
      });
      const turn = prompt(ctx, sessionId, "tell me a long story");
      await nextUpdate(state, (u) => u.sessionUpdate === "agent_message_chunk");
      const started = performance.now();
      await ctx.notify(methods.agent.session.cancel, { sessionId });
      const cancelled = await turn;
      const cancelMs = performance.now() - started;
      state.updates.length = 0;
      const next = await prompt(ctx, sessionId, "again words=4 fast");
      return {
        current: switched.configOptions[0].currentValue,
        cancelled,
        cancelMs,
        next,
        nextText: messageText(state.updates),
      };
    });
  },

  async permission(argv) {
    const state = newState();
    return withAgent(argv, state, async (ctx) => {
      const { session } = await open(ctx);
      const sessionId = session.sessionId;
      const allowed = await prompt(ctx, sessionId, "permission words=3 fast");
      const firstText = messageText(state.updates);
      state.answerPermissions = false;
      const asked = new Promise((resolve) => (state.onPermission = resolve));
      const turn = prompt(ctx, sessionId, "permission words=3 fast");
      await asked;
      await ctx.notify(methods.agent.session.cancel, { sessionId });
      const cancelled = await turn;
      return {
        allowed,
        firstText,
        permissions: state.permissions,
        cancelled,
        withdrawn: state.withdrawn,
      };
    });
  },

  async crash(argv) {
    const state = newState();
    return withAgent(argv, state, async (ctx) => {
      const { session } = await open(ctx);
      const sessionId = session.sessionId;
      let error = null;
      try {
        await prompt(ctx, sessionId, "crash");
      } catch (exc) {
        error = { code: exc.code, message: exc.message };
      }
      await nextUpdate(state, (u) => u._meta?.agentSupervisor?.notice === "agent_restarted");
      const next = await prompt(ctx, sessionId, "after words=3 fast");
      return { error, notices: notices(state.updates), next };
    });
  },

  // A session closed in one process is listed, loaded (its history replayed) and prompted in
  // the next one; session/resume and session/close work on it too.
  async sessions(argv) {
    const first = newState();
    const created = await withAgent(argv, first, async (ctx) => {
      const { init, session } = await open(ctx);
      await prompt(ctx, session.sessionId, "remember banana words=3 fast");
      const closed = await ctx.request(methods.agent.session.close, {
        sessionId: session.sessionId,
      });
      return { init, sessionId: session.sessionId, closed };
    });
    const second = newState();
    const reopened = await withAgent(argv, second, async (ctx) => {
      await ctx.request(methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION });
      const listed = await ctx.request(methods.agent.session.list, { cwd });
      const loaded = await ctx.request(methods.agent.session.load, {
        sessionId: created.sessionId,
        cwd,
        mcpServers: [],
      });
      const replayed = second.updates.map((u) => [u.sessionUpdate, u.content?.text ?? null]);
      second.updates.length = 0;
      const next = await prompt(ctx, created.sessionId, "go on words=3 fast");
      const resumed = await ctx.request(methods.agent.session.resume, {
        sessionId: created.sessionId,
        cwd,
      });
      const closed = await ctx.request(methods.agent.session.close, {
        sessionId: created.sessionId,
      });
      return { listed, loaded, replayed, next, resumed, closed };
    });
    return { created, reopened };
  },
};

// On a gateway session shared with a WebSocket client (the test's): that client stops the
// first turn; this one stops the second itself.
scenarios.shared = async (argv) => {
  const state = newState();
  return withAgent(argv, state, async (ctx) => {
    const { session } = await open(ctx);
    const sessionId = session.sessionId;
    const stoppedByOther = await prompt(ctx, sessionId, "first story slow words=80");
    state.updates.length = 0;
    const turn = prompt(ctx, sessionId, "second story slow words=80");
    await nextUpdate(state, (u) => u.sessionUpdate === "agent_message_chunk");
    await ctx.notify(methods.agent.session.cancel, { sessionId });
    const stoppedHere = await turn;
    const listed = await ctx.request(methods.agent.session.list, {});
    return { sessionId, stoppedByOther, stoppedHere, listed };
  });
};

// Steering the way agents advertise it: `_meta.steering` in initialize, `_session/steering`.
scenarios.steer = async (argv) => {
  const state = newState();
  return withAgent(argv, state, async (ctx) => {
    const { init, session } = await open(ctx);
    const sessionId = session.sessionId;
    const steer = (words) =>
      ctx.request("_session/steering", {
        sessionId,
        prompt: text(words),
        _meta: { steering: { idleBehavior: "promptRequired" } },
      });
    const turn = prompt(ctx, sessionId, "a story words=30 delay=0.05");
    await nextUpdate(state, (u) => u.sessionUpdate === "agent_message_chunk");
    const injected = await steer("turn left");
    const ended = await turn;
    const idle = await steer("nobody is running");
    return {
      advertised: init._meta?.steering ?? null,
      injected,
      ended,
      idle,
      text: messageText(state.updates),
      userChunks: state.updates
        .filter((u) => u.sessionUpdate === "user_message_chunk")
        .map((u) => u.content.text),
    };
  });
};

// The client's mcpServers (from ACP_TEST_MCP_SERVERS) reach the agent behind, which starts
// them; its `mcp` reply says what each one's first tool answered.
scenarios.mcp = async (argv) => {
  const state = newState();
  return withAgent(argv, state, async (ctx) => {
    const init = await ctx.request(methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION });
    const mcpServers = JSON.parse(process.env.ACP_TEST_MCP_SERVERS);
    const session = await ctx.request(methods.agent.session.new, { cwd, mcpServers });
    const answer = await prompt(ctx, session.sessionId, "mcp");
    return { mcp: init.agentCapabilities.mcpCapabilities, answer, text: messageText(state.updates) };
  });
};

// A real agent behind the front door, against the tests' fake model: a quick turn, a turn
// cancelled while the model streams, another quick turn.
scenarios.real = async (argv) => {
  const state = newState();
  return withAgent(argv, state, async (ctx) => {
    const { session } = await open(ctx);
    const sessionId = session.sessionId;
    const quick = await prompt(ctx, sessionId, "quick");
    const quickText = messageText(state.updates);
    state.updates.length = 0;
    const turn = prompt(ctx, sessionId, "stream");
    // An agent that sends nothing while its model streams (Amp's CLI says a message once it is
    // whole) is cancelled once the test, which watches its server, has made the file
    // ACP_TEST_CANCEL_WHEN: the server is streaming (polled: the test has no line to us).
    const when = process.env.ACP_TEST_CANCEL_WHEN;
    if (when) {
      while (!existsSync(when)) await new Promise((resolve) => setTimeout(resolve, 20));
    } else {
      await nextUpdate(state, (u) => u.sessionUpdate === "agent_message_chunk");
    }
    const started = performance.now();
    await ctx.notify(methods.agent.session.cancel, { sessionId });
    const cancelled = await turn;
    const cancelMs = performance.now() - started;
    state.updates.length = 0;
    const again = await prompt(ctx, sessionId, "quick");
    return { quick, quickText, cancelled, cancelMs, again, againText: messageText(state.updates) };
  });
};

// A gateway session someone else started (ACP_TEST_SESSION), found with session/list and
// joined with session/load: its history replayed first, then a prompt of our own.
scenarios.attachload = async (argv) => {
  const state = newState();
  return withAgent(argv, state, async (ctx) => {
    await ctx.request(methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION });
    const sessionId = process.env.ACP_TEST_SESSION;
    const listed = await ctx.request(methods.agent.session.list, {});
    const loaded = await ctx.request(methods.agent.session.load, { sessionId, cwd, mcpServers: [] });
    const replayed = state.updates.map((u) => [u.sessionUpdate, u.content?.text ?? null]);
    state.updates.length = 0;
    const next = await prompt(ctx, sessionId, "more words=3 fast");
    return { listed, loaded, replayed, next, nextText: messageText(state.updates) };
  });
};

// A cancel sent right behind its prompt, before any word of the turn: it still stops that
// turn (five times over), and the session goes on.
scenarios.immediate = async (argv) => {
  const state = newState();
  return withAgent(argv, state, async (ctx) => {
    const { session } = await open(ctx);
    const sessionId = session.sessionId;
    const stops = [];
    for (let i = 0; i < 5; i++) {
      const turn = prompt(ctx, sessionId, `story ${i} slow words=50`);
      await ctx.notify(methods.agent.session.cancel, { sessionId });
      stops.push((await turn).stopReason);
    }
    const after = await prompt(ctx, sessionId, "after words=3 fast");
    return { stops, after };
  });
};

// session/load of a recorded session (ACP_TEST_SESSION) in a new process: the replay, what
// the front door told (notices), and a prompt.
scenarios.reload = async (argv) => {
  const state = newState();
  return withAgent(argv, state, async (ctx) => {
    await ctx.request(methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION });
    const sessionId = process.env.ACP_TEST_SESSION;
    await ctx.request(methods.agent.session.load, { sessionId, cwd, mcpServers: [] });
    const replayed = state.updates.filter((u) => !u._meta?.agentSupervisor).length;
    const next = await prompt(ctx, sessionId, "again words=3 fast");
    return { replayed, next, notices: notices(state.updates) };
  });
};

// Prompts with more than text: an image, a link and an embedded resource reach an agent that
// takes them (demo-content says what came); the text-only demo refuses the image, saying
// why, and takes an embedded text resource inline.
scenarios.content = async (argv) => {
  const state = newState();
  const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]).toString("base64");
  const image = { type: "image", data: png, mimeType: "image/png" };
  const link = { type: "resource_link", uri: "file:///w/a.py", name: "a.py" };
  const resource = {
    type: "resource",
    resource: { uri: "file:///w/b.md", text: "# B", mimeType: "text/markdown" },
  };
  const ask = (sessionId, blocks) =>
    ctxRef.request(methods.agent.session.prompt, { sessionId, prompt: blocks });
  let ctxRef;
  return withAgent(argv, state, async (ctx) => {
    ctxRef = ctx;
    const { init, session } = await open(ctx);
    const sessionId = session.sessionId;
    const taken = await ask(sessionId, [...text("look words=3 fast"), image, link, resource]);
    const takenText = messageText(state.updates);
    await ctx.request(methods.agent.session.setConfigOption, {
      sessionId,
      configId: "agent",
      value: process.env.ACP_TEST_TEXT_AGENT,
    });
    let refused = null;
    try {
      await ask(sessionId, [...text("look words=3 fast"), image]);
    } catch (exc) {
      refused = { code: exc.code, message: exc.message };
    }
    state.updates.length = 0;
    const inlined = await ask(sessionId, [...text("read words=3 fast"), link, resource]);
    const thought = state.updates
      .filter((u) => u.sessionUpdate === "agent_thought_chunk")
      .map((u) => u.content.text)
      .join("");
    return {
      promptCapabilities: init.agentCapabilities.promptCapabilities,
      taken,
      takenText,
      refused,
      inlined,
      thought,
    };
  });
};

// Session modes of the agent behind, offered on: set one, a turn runs in it (the demo agent's
// thought names it), an unknown one is refused.
scenarios.modes = async (argv) => {
  const state = newState();
  return withAgent(argv, state, async (ctx) => {
    const { session } = await open(ctx);
    const sessionId = session.sessionId;
    const set = await ctx.request(methods.agent.session.setMode, { sessionId, modeId: "code" });
    const answer = await prompt(ctx, sessionId, "hi words=3 fast");
    let refused = null;
    try {
      await ctx.request(methods.agent.session.setMode, { sessionId, modeId: "plan" });
    } catch (exc) {
      refused = { code: exc.code, message: exc.message };
    }
    const thought = state.updates
      .filter((u) => u.sessionUpdate === "agent_thought_chunk")
      .map((u) => u.content.text)
      .join("");
    const modeUpdates = state.updates
      .filter((u) => u.sessionUpdate === "current_mode_update")
      .map((u) => u.currentModeId);
    return { modes: session.modes, set, answer, refused, thought, modeUpdates };
  });
};

// A real agent behind: a quick turn whose prompt carries an image (ACP_TEST_IMAGE, a PNG in
// base64); the test looks for it in what the agent sent the fake model.
scenarios.realimage = async (argv) => {
  const state = newState();
  return withAgent(argv, state, async (ctx) => {
    const { init, session } = await open(ctx);
    const image = { type: "image", data: process.env.ACP_TEST_IMAGE, mimeType: "image/png" };
    const answer = await ctx.request(methods.agent.session.prompt, {
      sessionId: session.sessionId,
      prompt: [...text("quick"), image],
    });
    return {
      promptCapabilities: init.agentCapabilities.promptCapabilities,
      answer,
      text: messageText(state.updates),
    };
  });
};

const result = await scenarios[scenario](JSON.parse(argvJson));
process.stdout.write(JSON.stringify(result) + "\n");
process.exit(0);
