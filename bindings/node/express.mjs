// ES module entry of `leasehold/express`: the same middleware as express.js.
import express from './express.js';

export const { lockRoute, limitConcurrency, problemTypes, PROBLEM_CONTENT_TYPE } = express;
export default express;
