// Preloaded into test servers started with node (`node --require ./loopback.cjs ...`): a server
// that listens without naming a host listens on 127.0.0.1 only, never on every interface.
const net = require("node:net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if ((typeof args[0] === "number" || typeof args[0] === "string") && typeof args[1] !== "string") {
    args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
