// Swagger UI for /openapi.json, from files this server serves itself (no CDN), started here
// rather than from an inline script so that the page runs under a CSP without 'unsafe-inline'.
window.ui = SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  // the default asks validator.swagger.io to check the document: nothing leaves this server
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
