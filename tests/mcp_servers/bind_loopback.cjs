// Preloaded with `node --require` by the tests: makes every `listen(port)` without a host bind
// 127.0.0.1 only (server-everything's Streamable HTTP mode listens on all interfaces otherwise).
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const port = args[0];
  const isPort = typeof port === "number" || (typeof port === "string" && /^\d+$/.test(port));
  if (isPort && typeof args[1] !== "string") {
    args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
